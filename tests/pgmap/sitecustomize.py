"""Tests only (see mapping.py): a child process of a test run on the PostgreSQL backend maps
store folders to databases exactly as the test process does."""

import os

if os.environ.get("VIANO_TEST_PG_ADMIN"):
    from tests.pgmap.mapping import install_mapping

    install_mapping(os.environ["VIANO_TEST_PG_ADMIN"], setattr)
