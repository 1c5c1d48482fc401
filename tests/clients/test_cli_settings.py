"""Where the command line finds its replica, passphrase and profile (clients/cli/settings.py):
flags > environment > TOML config > defaults, on real replica files; the environment is only
what each run is given (CliRunner), with XDG folders inside the test's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from clients.cli import main
from clients.schema import CHAT_SCHEMA
from replica import Replica
from tests.clients.test_cli import PASSPHRASE, assert_user_error

WRONG = "not the passphrase"
SOURCES = ("flag", "env", "config", "default")


@pytest.fixture(scope="module")
def homes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One replica per way of naming it; each holds a message saying which it is. The last
    lives where platformdirs puts it when XDG_DATA_HOME is the test's `data` folder."""
    root = tmp_path_factory.mktemp("settings")
    paths = {source: root / f"{source}.db" for source in SOURCES}
    paths["default"] = root / "data" / "sealsync" / "replica.db"
    paths["default"].parent.mkdir(parents=True)
    for source, path in paths.items():
        replica, _recovery_key = Replica.create(path, CHAT_SCHEMA, PASSPHRASE)
        with replica:
            replica.create_profile("work")
            replica.put("messages", "where", {"at": source})
            replica.put("messages", "where", {"at": f"{source}, work"}, profile="work")
    return {"root": root, **paths}


def run(homes: dict[str, Path], *args: str, config: str = "", input: str | None = None,
        **env: str) -> Result:  # fmt: skip
    """`sealsync ARGS` with only `env` set (plus the test's XDG folders) and `config` as the
    TOML file in the default config place."""
    config_home = homes["root"] / "config"
    (config_home / "sealsync").mkdir(parents=True, exist_ok=True)
    (config_home / "sealsync" / "config.toml").write_text(config)
    base = {"XDG_CONFIG_HOME": str(config_home), "XDG_DATA_HOME": str(homes["root"] / "data"),
            "SEALSYNC_REPLICA": None, "SEALSYNC_PASSPHRASE": None, "SEALSYNC_CONFIG": None}  # fmt: skip
    return CliRunner().invoke(main, list(args), env={**base, **env}, input=input)


def where(result: Result) -> str:
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)["doc"]
    assert isinstance(document, dict)
    return str(document["at"])


def test_the_replica_is_found_by_flag_then_environment_then_config_then_data_dir(
    homes: dict[str, Path],
) -> None:
    get = ("get", "messages", "where", "--json")
    flag = ("--replica", str(homes["flag"]))
    env = {"SEALSYNC_REPLICA": str(homes["env"]), "SEALSYNC_PASSPHRASE": PASSPHRASE}
    config = f'replica = "{homes["config"]}"\n'
    assert where(run(homes, *flag, *get, config=config, **env)) == "flag"
    assert where(run(homes, *get, config=config, **env)) == "env"
    assert where(run(homes, *get, config=config, SEALSYNC_PASSPHRASE=PASSPHRASE)) == "config"
    assert where(run(homes, *get, SEALSYNC_PASSPHRASE=PASSPHRASE)) == "default"


def test_a_config_file_named_by_flag_or_environment_replaces_the_default_one(
    homes: dict[str, Path], tmp_path: Path
) -> None:
    named = tmp_path / "named.toml"
    named.write_text(f'replica = "{homes["env"]}"\n')
    default_config = f'replica = "{homes["config"]}"\n'
    get = ("get", "messages", "where", "--json")
    by_flag = run(homes, "--config", str(named), *get, config=default_config,
                  SEALSYNC_PASSPHRASE=PASSPHRASE)  # fmt: skip
    assert where(by_flag) == "env"
    by_env = run(homes, *get, config=default_config, SEALSYNC_CONFIG=str(named),
                 SEALSYNC_PASSPHRASE=PASSPHRASE)  # fmt: skip
    assert where(by_env) == "env"


@pytest.mark.parametrize(
    ("right", "wrong_below"),
    [("flag", ("env", "config")), ("env", ("config",)), ("config", ()), ("prompt", ())],
)
def test_the_passphrase_comes_from_the_first_source_given(
    homes: dict[str, Path], tmp_path: Path, right: str, wrong_below: tuple[str, ...]
) -> None:
    """The source ranked `right` holds the passphrase, every source below it a wrong one:
    the command works only if the right one is read. Then the same with the right and wrong
    ones swapped: it must fail, nothing read from below."""
    for swapped in (False, True):
        good, bad = (WRONG, PASSPHRASE) if swapped else (PASSPHRASE, WRONG)
        secrets = {right: good, **{source: bad for source in wrong_below}}
        files = {}
        for source in ("flag", "config"):
            if source in secrets:
                files[source] = tmp_path / f"{source}-{swapped}.txt"
                files[source].write_text(secrets[source] + "\n")
        args = ["--replica", str(homes["flag"])]
        args += ["--passphrase-file", str(files["flag"])] if "flag" in files else []
        config = f'passphrase_file = "{files["config"]}"\n' if "config" in files else ""
        env = {"SEALSYNC_PASSPHRASE": secrets["env"]} if "env" in secrets else {}
        typed = secrets["prompt"] + "\n" if "prompt" in secrets else None
        result = run(homes, *args, "get", "messages", "where", "--json", config=config,
                     input=typed, **env)  # fmt: skip
        if swapped:
            assert_user_error(result, "does not unlock")
        else:
            assert where(result) == "flag"


def test_a_profile_in_the_config_is_the_default_a_flag_overrides(homes: dict[str, Path]) -> None:
    replica = ("--replica", str(homes["flag"]))
    config = 'profile = "work"\n'
    get = ("get", "messages", "where", "--json")
    assert where(run(homes, *replica, *get, config=config, SEALSYNC_PASSPHRASE=PASSPHRASE)) == (
        "flag, work"
    )
    overridden = run(homes, *replica, *get, "--profile", "default", config=config,
                     SEALSYNC_PASSPHRASE=PASSPHRASE)  # fmt: skip
    assert where(overridden) == "flag"


def test_a_bad_config_file_is_one_error_line_naming_it(homes: dict[str, Path]) -> None:
    for config, words in (("replica = [", "is not TOML"), ('colour = "red"\n', "unknown setting"),
                          ("replica = 7\n", "must be a string")):  # fmt: skip
        result = run(homes, "get", "messages", "where", config=config,
                     SEALSYNC_PASSPHRASE=PASSPHRASE)  # fmt: skip
        assert_user_error(result, words, "config.toml")
