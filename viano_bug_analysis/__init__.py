"""Viano's public face: open a store, intake cases, read packages.

The hypothesis phase's ``analysis`` module (``HypothesisBuilder``, ``HypothesisConfig``)
lands with that phase.
"""

from actors import StoreHandle as StoreHandle
from actors import open_store as open_store
from engine import Attachment as Attachment
from engine import Config as Config
from engine import IntakePlan as IntakePlan
from engine import Published as Published
from engine import VianoError as VianoError
from engine import prepare_intake as prepare_intake
from engine import verify_store as verify_store
