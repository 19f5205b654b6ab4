"""load_agent_config: files in, AgentConfig or one-line ConfigError out."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumond.config import AgentConfig, ConfigError, load_agent_config

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "agent.yaml"


@pytest.fixture
def write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write text to agent.yaml in a temp dir and return the relative name the loader sees."""
    monkeypatch.chdir(tmp_path)

    def _write(text: str | bytes) -> str:
        path = tmp_path / "agent.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return "agent.yaml"

    return _write


def error_of(path: str | Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_agent_config(path)
    text = str(info.value)
    assert "\n" not in text
    return text


def test_none_gives_defaults() -> None:
    assert load_agent_config(None) == AgentConfig.default()


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "---\n"])
def test_empty_file_gives_defaults(write, text: str) -> None:
    assert load_agent_config(write(text)) == AgentConfig.default()


def test_values_are_read(write) -> None:
    config = load_agent_config(write("listen: 127.0.0.1:9999\nsampling:\n  fast_interval_s: 2\n"))
    assert (config.listen.host, config.listen.port) == ("127.0.0.1", 9999)
    assert config.sampling.fast_interval_s == 2.0
    assert config.sampling.slow_interval_s == 30.0


def test_accepts_path_objects(write, tmp_path: Path) -> None:
    write("node_name: n1\n")
    assert load_agent_config(tmp_path / "agent.yaml").node_name == "n1"


def test_shipped_example_validates_and_equals_the_defaults() -> None:
    assert load_agent_config(EXAMPLE) == AgentConfig.default()


def test_validation_error_names_file_field_and_value(write) -> None:
    text = error_of(write("sampling:\n  fast_interval_s: -1\n"))
    assert text == "agent.yaml: sampling.fast_interval_s: must be greater than 0 (got -1)"


def test_unknown_key_suggests_the_right_one(write) -> None:
    assert error_of(write("lsiten: 0.0.0.0:9480\n")) == (
        "agent.yaml: lsiten: unknown key (did you mean 'listen'?)"
    )
    assert error_of(write("jobs:\n  cache_sise: 10\n")) == (
        "agent.yaml: jobs.cache_sise: unknown key (did you mean 'cache_size'?)"
    )


def test_unknown_key_without_a_close_match(write) -> None:
    assert error_of(write("zzz: 1\n")) == "agent.yaml: zzz: unknown key"


def test_several_errors_report_the_first_and_count_the_rest(write) -> None:
    text = error_of(write("sampling: {fast_interval_s: -1, slow_interval_s: 0}\njobs: {cache_size: 1}\n"))
    assert text == "agent.yaml: sampling.fast_interval_s: must be greater than 0 (got -1) (+2 more: fix this one and check again)"


def test_yaml_syntax_error_names_the_line(write) -> None:
    text = error_of(write("listen: 0.0.0.0:9480\nsampling:\n  fast_interval_s: [1\n"))
    assert text.startswith("agent.yaml: line ")
    assert ": could not parse YAML: " in text


def test_yaml_error_line_number_is_one_based(write) -> None:
    assert error_of(write("a: 1\nb: 2\nc: d: e\n")).startswith("agent.yaml: line 3: could not parse YAML: ")


def test_duplicate_keys_are_errors(write) -> None:
    text = error_of(write("sampling: {fast_interval_s: 2}\nlisten: 0.0.0.0:1\nsampling: {}\n"))
    assert text == "agent.yaml: line 3: could not parse YAML: duplicate key 'sampling' (first on line 1)"


def test_yaml_merge_keys_still_work(write) -> None:
    # An explicit key overriding a merged one is not a duplicate.
    config = load_agent_config(
        write("sampling:\n  <<: {fast_interval_s: 2, slow_interval_s: 40}\n  slow_interval_s: 50\n")
    )
    assert (config.sampling.fast_interval_s, config.sampling.slow_interval_s) == (2.0, 50.0)


@pytest.mark.parametrize(
    ("text", "kind"), [("- listen\n", "a list"), ("just text\n", "a string"), ("42\n", "a number")]
)
def test_top_level_must_be_a_mapping(write, text: str, kind: str) -> None:
    assert error_of(write(text)) == f"agent.yaml: top level must be a mapping of keys (got {kind})"


def test_missing_file() -> None:
    assert error_of("/nope.yaml") == "/nope.yaml: cannot read: No such file or directory"


def test_directory(tmp_path: Path) -> None:
    assert error_of(tmp_path) == f"{tmp_path}: cannot read: Is a directory"


def test_not_utf8(write) -> None:
    assert error_of(write(b"listen: \xff\n")).startswith("agent.yaml: cannot read: not UTF-8 text")


def test_unsafe_yaml_tags_are_refused(write) -> None:
    text = error_of(write("listen: !!python/object/apply:os.system ['true']\n"))
    assert text.startswith("agent.yaml: line 1: could not parse YAML: ")


def test_config_error_keeps_source_and_problem(write) -> None:
    with pytest.raises(ConfigError) as info:
        load_agent_config(write("node_name: ''\n"))
    assert info.value.source == "agent.yaml"
    assert info.value.problem == "node_name: must not be empty (got '')"


@pytest.mark.parametrize("word", ["off", "Off", "OFF", "no"])
def test_an_unquoted_off_says_to_quote_it(write, word: str) -> None:
    # YAML 1.1 reads a bare off / no as false; the line must say why and what to type.
    assert error_of(write(f"policy:\n  mode: {word}\n")) == (
        "agent.yaml: policy.mode: must be one of 'enforce', 'dry_run' or 'off' (got false: YAML reads an unquoted "
        'off as false; quote it: "off")'
    )


def test_a_quoted_off_is_accepted(write) -> None:
    assert load_agent_config(write('policy:\n  mode: "off"\n')).policy.mode == "off"


def test_a_file_past_the_size_bound_is_refused_with_one_line(write) -> None:
    from gpumond.config.load import MAX_FILE_BYTES

    path = write(b"# " + b"x" * MAX_FILE_BYTES + b"\n")
    assert error_of(path) == ("agent.yaml: larger than the 4 MiB a config or scenario file may be: is it the file "
                              "you meant? (a power_limit.per_gpu table for every GPU of an 80,000-GPU fleet fits)")
    at_bound = b"listen: 127.0.0.1:9480\n"
    assert load_agent_config(write(at_bound + b"#" * (MAX_FILE_BYTES - len(at_bound) - 1) + b"\n")).listen.port == 9480


@pytest.mark.parametrize("name", ["deploy/examples/agent.yaml", "deploy/examples/rules.yaml",
                                  "gpumond/nvml/sim/scenarios/demo.yaml"])
def test_libyaml_reads_what_the_pure_python_parser_reads(name: str) -> None:
    import yaml

    from gpumond.config import load as loader

    if loader._FastUniqueKeyLoader is None:
        pytest.skip("PyYAML without libyaml: only the pure-Python parser runs")
    text = (EXAMPLE.parents[2] / name).read_text()
    assert yaml.load(text, Loader=loader._FastUniqueKeyLoader) == yaml.load(text, Loader=loader._UniqueKeyLoader)


def test_a_duplicate_key_is_refused_by_libyaml_too(write) -> None:
    import yaml

    from gpumond.config import load as loader

    if loader._FastUniqueKeyLoader is None:
        pytest.skip("PyYAML without libyaml")
    with pytest.raises(yaml.YAMLError, match="duplicate key 'listen'"):
        yaml.load("listen: a\nlisten: b\n", Loader=loader._FastUniqueKeyLoader)
