"""Strict configuration loading."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import Config, ConfigError
from tests.conftest import REPO


def _load(tmp_path: Path, text: str) -> Config:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return Config.load(p)


class TestExample:
    def test_example_file_loads_with_contract_defaults(self) -> None:
        """config/analysis.example.toml loads and carries the contracted defaults."""
        c = Config.load(REPO / "config" / "analysis.example.toml")
        assert (c.hypotheses.min_hypotheses, c.hypotheses.max_hypotheses,
                c.hypotheses.initial_budget) == (3, 5, 100)
        assert c.retry.max_rounds == 10 and c.intake.limits.max_compression_ratio == 200
        assert [p.kind for p in c.providers] == ["openai", "anthropic"]

    def test_empty_file_is_defaults(self, tmp_path: Path) -> None:
        """An empty file means built-in defaults."""
        assert _load(tmp_path, "") == Config.defaults()


BAD = {
    "unknown key": ("[hypotheses]\nmin_hypothesis = 3\n", "min_hypothesis"),
    "unknown table": ("[hypothesis]\nmin_hypotheses = 3\n", "hypothesis"),
    "string for int": ('[hypotheses]\nmin_hypotheses = "3"\n', "hypotheses.min_hypotheses"),
    "bool for int": ("[intake.limits]\nmax_members = true\n", "intake.limits.max_members"),
    "float for int": ("[hypotheses]\ninitial_budget = 9.5\n", "hypotheses.initial_budget"),
    "zero count": ("[hypotheses]\nmax_hypotheses = 0\n", "max_hypotheses"),
    "negative budget": ("[hypotheses]\ninitial_budget = -1\n", "initial_budget"),
    "min above max": ("[hypotheses]\nmin_hypotheses = 6\n", "min_hypotheses (6) exceeds"),
    "unknown provider kind": ('[[providers]]\nname = "a"\nkind = "ollama-x"\n', "kind"),
    "api key in file": ('[[providers]]\nname = "a"\nkind = "fixture"\npath = "f"\n'
                        'api_key = "sk-live-123"\n', "api_key"),
    "string auto_confirm": ('[interpretation]\nauto_confirm = "false"\n', "auto_confirm"),
    "duplicate provider": ('[[providers]]\nname = "a"\nkind = "fixture"\npath = "x"\n'
                           '[[providers]]\nname = "a"\nkind = "fixture"\npath = "y"\n', "unique"),
    "not toml": ("[hypotheses\n", "not valid TOML"),
    "providers as a table": ('[providers]\nname = "a"\nkind = "fixture"\npath = "f"\n',
                             "providers: expected an array, got a table"),
    "providers as a string": ('providers = "a"\n', "providers: expected an array, got a string"),
    # A table given as something else said "argument of type 'int' is not iterable" or
    # "unknown error ('str' object has no attribute 'keys')".
    "store url empty": ('[store]\nurl = ""\n', "url must name a folder or a database"),
    "store url with NUL": ('[store]\nurl = "s\\u0000"\n', "url must name a folder"),
    "blob_root blank": ('[store]\nblob_root = " "\n', "blob_root must name a folder"),
    "store as a number": ("store = 1\n", "store: expected a table (object), got an integer"),
    "retry as a string": ('retry = "x"\n', "retry: expected a table (object), got a string"),
    "limits as a boolean": ("[intake]\nlimits = true\n",
                            "intake.limits: expected a table (object), got a boolean"),
    "a provider as an array": ("providers = [[]]\n",
                               "providers[0]: expected a table (object), got an array"),
    # A base_url that no HTTP client can call was found only at the first dispatch, which
    # ended the case in ERROR provider_configuration.
    **{f"base_url {url!r}": (f'[[providers]]\nname = "a"\nkind = "openai"\nmodel = "m"\n'
                             f'base_url = "{url}"\n', "base_url must be an http")
       for url in ("ftp://h/v1", "127.0.0.1:8080/v1", "http://", "http://h:99999/v1",
                   "file:///etc/passwd", "h/v1",
                   # urlsplit accepts these, httpx does not (or sends them elsewhere):
                   "http://[::1]x/v1", "http://a b/v1", "http://h\\t/v1", "http://h:0/v1",
                   "http://xn--zz.example/v1", "http://h/v1\\u0000")},
    # A setting the kind does not read was accepted and looked in force.
    "path on openai": ('[[providers]]\nname = "a"\nkind = "openai"\nmodel = "m"\n'
                       'base_url = "http://h/v1"\npath = "answers"\n',
                       "of kind 'openai' does not use 'path'"),
    "path on anthropic": ('[[providers]]\nname = "a"\nkind = "anthropic"\nmodel = "m"\n'
                          'base_url = "http://h/v1"\npath = ""\n',
                          "of kind 'anthropic' does not use 'path'"),
    "base_url and model on fixture": ('[[providers]]\nname = "a"\nkind = "fixture"\n'
                                      'path = "f"\nbase_url = "http://u:pw@h/v1"\n'
                                      'model = "m"\n',
                                      "does not use 'base_url', 'model'"),
    "api_key_env on fixture": ('[[providers]]\nname = "a"\nkind = "fixture"\npath = "f"\n'
                               'api_key_env = "K"\n', "does not use 'api_key_env'"),
}


class TestRefusals:
    @pytest.mark.parametrize("label", sorted(BAD))
    def test_refused_naming_key_and_file(self, tmp_path: Path, label: str) -> None:
        """Bad configuration is refused with the key (or problem) and the file named."""
        text, needle = BAD[label]
        with pytest.raises(ConfigError) as info:
            _load(tmp_path, text)
        assert needle in info.value.message
        assert str(tmp_path / "c.toml") in info.value.message
        assert info.value.reason == "config_invalid"

    def test_secret_value_never_echoed(self, tmp_path: Path) -> None:
        """A key pasted into the file is refused without repeating its value."""
        with pytest.raises(ConfigError) as info:
            _load(tmp_path, BAD["api key in file"][0])
        assert "sk-live-123" not in str(info.value)
        with pytest.raises(ConfigError) as info:  # nor a base_url a kind does not use
            _load(tmp_path, BAD["base_url and model on fixture"][0])
        assert "pw" not in str(info.value) and "http" not in str(info.value)

    def test_missing_file(self, tmp_path: Path) -> None:
        """A named configuration file that does not exist is an error, not defaults."""
        with pytest.raises(ConfigError, match="not found"):
            Config.load(tmp_path / "absent.toml")


class TestWhatIsNotAConfigFile:
    """Whatever --config names is read within bounds: a folder, a FIFO (reading would
    block) or a device (/dev/zero never ends) is refused unread, and a file too large or
    nested too deeply for tomllib is config_invalid, never an internal error."""

    @pytest.mark.parametrize("kind", ["folder", "fifo", "device"])
    def test_not_a_regular_file(self, tmp_path: Path, kind: str) -> None:
        import os

        path = tmp_path / "c.toml"
        if kind == "folder":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
        else:
            path = Path("/dev/zero")
        with pytest.raises(ConfigError, match="not a regular file"):
            Config.load(path)

    def test_too_large(self, tmp_path: Path) -> None:
        path = tmp_path / "c.toml"
        path.write_text("# padding\n" * 200_000)  # 2 MB of valid TOML
        with pytest.raises(ConfigError, match="larger than"):
            Config.load(path)

    @pytest.mark.parametrize("deep", ["a = " + "[" * 5000 + "1" + "]" * 5000,
                                      "a = " + "{x = " * 5000 + "1" + "}" * 5000])
    def test_nested_too_deeply(self, tmp_path: Path, deep: str) -> None:
        path = tmp_path / "c.toml"
        path.write_text(deep + "\n")
        with pytest.raises(ConfigError, match="nested too deeply") as info:
            Config.load(path)
        assert info.value.reason == "config_invalid"


def _numeric_fields() -> list[tuple[str, str, type, tuple[float, float, bool] | None]]:
    """Every number a configuration file can set: (table, key, type, range), found by
    walking the config classes, so a number added later is covered without a list here.
    The table "providers" stands for a ``[[providers]]`` entry."""
    import typing

    import attrs

    from engine import ProviderConfig

    out = []

    def walk(cls: type, table: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in attrs.fields(cls):
            kind = hints[f.name]
            if attrs.has(kind):
                walk(kind, f"{table}.{f.name}" if table else f.name)
            elif kind in (int, float):
                out.append((table, f.name, kind, f.metadata.get("range")))

    walk(Config, "")
    walk(ProviderConfig, "providers")
    return out


NUMBERS = _numeric_fields()


def _setting(table: str, key: str, value: str) -> str:
    if table == "providers":
        return f'[[providers]]\nname = "a"\nkind = "fixture"\npath = "f"\n{key} = {value}\n'
    return f"[{table}]\n{key} = {value}\n"


def test_the_walk_finds_the_numbers() -> None:
    found = {(t, k) for t, k, _, _ in NUMBERS}
    assert {("retry", "max_rounds"), ("providers", "max_concurrency"), ("store", "lease_s"),
            ("hypotheses.limits", "max_output_bytes"), ("gateway", "cooldown_s")} <= found
    assert len(found) >= 30


class TestNonFiniteNumbers:
    @pytest.mark.parametrize("value", ["nan", "inf", "-inf", "+nan"])
    @pytest.mark.parametrize(("table", "key"), [(t, k) for t, k, _, _ in NUMBERS])
    def test_nan_and_inf_are_refused_wherever_a_number_is_read(
            self, tmp_path: Path, table: str, key: str, value: str) -> None:
        """TOML allows nan and inf; no count, size, delay or ratio means either."""
        with pytest.raises(ConfigError) as info:
            _load(tmp_path, _setting(table, key, value))
        assert key in info.value.message


class TestEveryNumberHasARange:
    """A number with no upper bound was accepted and then broke what was computed from it
    after work had begun: max_rounds past 2**62 a store row could not hold (a generation
    written, every dispatch calling the model again), a delay past the calendar, an output
    limit no buffer could be allocated for, a concurrency no gateway could start. Every
    number has a range, and both sides of it are refused before anything runs."""

    @pytest.mark.parametrize(("table", "key", "kind", "limits"), NUMBERS)
    def test_out_of_range_is_refused(self, tmp_path: Path, table: str, key: str,
                                     kind: type, limits: tuple[float, float, bool] | None
                                     ) -> None:
        assert limits is not None, f"{table}.{key} has no range (engine/_config.py)"
        low, high, above = limits
        too_big = high + 1 if kind is int else high * 2
        too_small = low if above else low - 1
        for value in (too_big, too_small, 2**63, -(2**63)):
            text = repr(value) if kind is int else repr(float(value))
            with pytest.raises(ConfigError) as info:
                _load(tmp_path, _setting(table, key, text))
            assert key in info.value.message and info.value.reason == "config_invalid"

    @pytest.mark.parametrize(("table", "key", "kind", "limits"), NUMBERS)
    def test_both_ends_are_accepted(self, tmp_path: Path, table: str, key: str, kind: type,
                                    limits: tuple[float, float, bool] | None) -> None:
        assert limits is not None
        low, high, above = limits
        ends = [high] if above else [low, high]
        for value in ends:
            text = repr(int(value)) if kind is int else repr(float(value))
            try:
                _load(tmp_path, _setting(table, key, text))
            except ConfigError as exc:  # only a rule between two fields may refuse it
                assert "exceeds" in exc.message, exc.message


class TestApiKeyEnv:
    @pytest.mark.parametrize("pasted", ["sk-proj-AbC123xyz", "sk ant 123", "1STARTS_DIGIT",
                                        "has=equals", "$OPENAI_API_KEY", ""])
    def test_a_value_that_is_not_a_variable_name_is_refused_unechoed(
            self, tmp_path: Path, pasted: str) -> None:
        """api_key_env must name a variable; a pasted key is refused without its value."""
        with pytest.raises(ConfigError) as info:
            _load(tmp_path, f'[[providers]]\nname = "a"\nkind = "openai"\n'
                            f'base_url = "http://x"\nmodel = "m"\napi_key_env = "{pasted}"\n')
        assert "api_key_env" in info.value.message
        if pasted:
            assert pasted not in str(info.value) and pasted not in info.value.hint

    def test_a_variable_name_is_accepted(self, tmp_path: Path) -> None:
        c = _load(tmp_path, '[[providers]]\nname = "a"\nkind = "openai"\nbase_url = "http://x"'
                            '\nmodel = "m"\napi_key_env = "OPENAI_API_KEY_2"\n')
        assert c.providers[0].api_key_env == "OPENAI_API_KEY_2"


def test_a_report_limit_beyond_what_a_phase_reads_whole_is_refused(tmp_path: Path) -> None:
    """Phases read a report whole and refuse any document over MAX_DOCUMENT_BYTES unread, so
    intake may not take in a report they could never read."""
    from engine._config import MAX_DOCUMENT_BYTES

    path = tmp_path / "c.toml"
    path.write_text(f"[intake.limits]\nmax_report_bytes = {MAX_DOCUMENT_BYTES + 1}\n")
    with pytest.raises(ConfigError, match="max_report_bytes"):
        Config.load(path)
    path.write_text(f"[intake.limits]\nmax_report_bytes = {MAX_DOCUMENT_BYTES}\n")
    assert Config.load(path).intake.limits.max_report_bytes == MAX_DOCUMENT_BYTES


def test_providers_written_as_one_table_hint_names_the_double_brackets(tmp_path: Path) -> None:
    """`[providers]` for `[[providers]]` says how to write it, not what cattrs tripped on."""
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, '[providers]\nname = "a"\nkind = "fixture"\npath = "f"\n')
    assert "[[providers]]" in info.value.hint
    assert "keys" not in info.value.message  # the old "'str' object has no attribute 'keys'"


@pytest.mark.parametrize("value", ["ab", {"a": "b"}, b"ab", 7])
@pytest.mark.parametrize("type_", [tuple[str, ...], list[str], tuple[str, str]])
def test_strict_converters_never_spread_a_non_array_into_an_array(value: object,
                                                                  type_: object) -> None:
    """The class: cattrs turns "ab" into ('a', 'b') and a table into its keys; we refuse."""
    import cattrs

    from engine._strict import LENIENT, STRICT, structure_errors

    for converter in (STRICT, LENIENT):
        with pytest.raises(cattrs.BaseValidationError) as info:
            converter.structure({"x": value}, dict[str, type_])  # type: ignore[index]
        assert any("expected an array" in line for line in structure_errors(info.value))


def test_a_base_url_with_credentials_is_refused_unechoed(tmp_path: Path) -> None:
    """The refusal does not repeat a URL that may carry credentials."""
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, '[[providers]]\nname = "a"\nkind = "openai"\nmodel = "m"\n'
                        'base_url = "gopher://user:pw-SECRET-77@h/v1?key=k-SECRET-88"\n')
    assert "SECRET" not in str(info.value) and "base_url" in info.value.message


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/v1", "https://api.example.com/v1",
                                 "http://[::1]:9/v1", "https://user:pw@h.example/v1?key=k",
                                 "https://bücher.example/v1"])
def test_a_base_url_a_client_can_call_is_accepted(tmp_path: Path, url: str) -> None:
    c = _load(tmp_path, f'[[providers]]\nname = "a"\nkind = "openai"\nmodel = "m"\n'
                        f'base_url = "{url}"\n')
    assert c.providers[0].base_url == url


def test_a_config_file_that_starts_with_a_bom_is_read(tmp_path: Path) -> None:
    """Reports accept a UTF-8 BOM (editors write one); the configuration refused it as
    not TOML."""
    path = tmp_path / "c.toml"
    path.write_bytes(b"\xef\xbb\xbf[retry]\nmax_rounds = 3\n")
    assert Config.resolve(path).retry.max_rounds == 3
