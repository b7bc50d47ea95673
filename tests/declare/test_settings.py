"""`hefbuild.toml` [cache]: the file, the environment over it, credentials kept out of sight,
one SpecError line for every mistake, and no setting in any action key."""

from __future__ import annotations

import base64
import inspect
import os
import shutil
from pathlib import Path

import pytest
from fakes.fake_executor import FakeExecutor

from hefbuild.declare.project import load_project
from hefbuild.declare.settings import DEFAULT_TIMEOUT_S, Credentials, Settings, load_settings
from hefbuild.digest import canonical_json
from hefbuild.engine.engine import Engine
from hefbuild.errors import SpecError
from hefbuild.plan.key import describe
from hefbuild.remote.signing import generate

PUB_A = "ci-2026:" + base64.b64encode(bytes(range(32))).decode()
PUB_B = "laptop.old_1:" + base64.b64encode(bytes(range(32, 64))).decode()
TOKEN = "tok-3f9a1c7e"  # distinctive, so a leak cannot hide in other text
PASSWORD = "pw-b81d22e0"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    return root


@pytest.fixture
def no_netrc(tmp_path: Path) -> dict[str, str]:
    """An env whose netrc does not exist: the machine's ~/.netrc never leaks in."""
    return {"NETRC": str(tmp_path / "absent.netrc"), "HOME": str(tmp_path / "home")}


def write(root: Path, text: str) -> None:
    (root / "hefbuild.toml").write_text(text)


def cache_file(**values: str) -> str:
    """A [cache] table from already-TOML-encoded values."""
    return "[cache]\n" + "".join(f"{k} = {v}\n" for k, v in values.items())


def load(root: Path, env: dict[str, str], **overrides: str) -> Settings:
    return load_settings(root, env={**env, **overrides})


def spec_error(root: Path, env: dict[str, str], key: str, **overrides: str) -> str:
    """The one-line message, checked to start with the file and name `key`."""
    with pytest.raises(SpecError) as err:
        load(root, env, **overrides)
    message = str(err.value)
    assert "\n" not in message, message
    assert message.startswith("hefbuild.toml:"), message
    assert key in message, f"{key!r} not named in: {message}"
    return message


def netrc_file(tmp_path: Path, host: str, login: str, password: str) -> str:
    path = tmp_path / "netrc"
    path.write_text(f"machine {host}\n  login {login}\n  password {password}\n")
    path.chmod(0o600)
    return str(path)


# -- the file ------------------------------------------------------------------------------


def test_no_file_means_no_remote(root, no_netrc):
    cache = load(root, no_netrc).cache
    assert cache.remote is None and cache.shown == "(none)"
    assert cache.upload is False
    assert cache.timeout_s == DEFAULT_TIMEOUT_S
    assert cache.trusted_keys == () and cache.signing_key is None and cache.ca_bundle is None
    assert not cache.credentials.present


def test_empty_cache_table_is_the_default(root, no_netrc):
    write(root, "[cache]\n")
    assert load(root, no_netrc) == Settings()


def test_full_file_parses(root, no_netrc):
    (root / "keys").mkdir()
    (root / "keys" / "ci.secret").write_text("not read by load_settings\n")
    (root / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    write(root, cache_file(remote='"https://cache.example.org/hefbuild"', upload="true",
                           timeout='"45s"', trusted_keys=f'["{PUB_A}", "{PUB_B}"]',
                           signing_key='"keys/ci.secret"', ca_bundle='"ca.pem"'))
    cache = load(root, no_netrc).cache
    assert cache.remote == "https://cache.example.org/hefbuild"
    assert cache.shown == "https://cache.example.org/hefbuild"
    assert cache.upload is True
    assert cache.timeout_s == 45.0
    assert cache.trusted_keys == (PUB_A, PUB_B)
    assert cache.signing_key == root / "keys" / "ci.secret"
    assert cache.ca_bundle == root / "ca.pem"
    assert not cache.credentials.present


@pytest.mark.parametrize(("url", "remote"), [
    ("http://cache.local:8080/x", "http://cache.local:8080/x"),
    ("https://cache.example.org/hefbuild/", "https://cache.example.org/hefbuild"),
    ("https://Cache.Example.ORG", "https://cache.example.org"),
    ("file:///mnt/shared/hefbuild-cache", "file:///mnt/shared/hefbuild-cache"),
    ("file:///mnt/shared/hefbuild-cache/", "file:///mnt/shared/hefbuild-cache"),
    ("file://localhost/mnt/cache", "file:///mnt/cache"),
    ("http://[::1]:8080/x", "http://[::1]:8080/x"),
    ("http://[::1]/x", "http://[::1]/x"),
    ("https://[2001:db8::7]:8443/c", "https://[2001:db8::7]:8443/c"),
])
def test_remote_urls(root, no_netrc, url, remote):
    write(root, cache_file(remote=f'"{url}"'))
    assert load(root, no_netrc).cache.remote == remote


@pytest.mark.parametrize(("value", "seconds"), [
    ('"30s"', 30.0), ('"2m"', 120.0), ('"1h"', 3600.0), ("12", 12.0), ("1.5", 1.5),
    ('"90"', 90.0),
])
def test_timeout_in_the_file(root, no_netrc, value, seconds):
    write(root, cache_file(timeout=value))
    assert load(root, no_netrc).cache.timeout_s == seconds


def test_absolute_key_and_ca_paths(root, tmp_path, no_netrc):
    key = tmp_path / "elsewhere.secret"
    key.write_text("x\n")
    write(root, cache_file(signing_key=f'"{key}"', ca_bundle=f'"{key}"'))
    cache = load(root, no_netrc).cache
    assert cache.signing_key == key and cache.ca_bundle == key


def test_a_generated_public_key_is_accepted_as_trusted(root, tmp_path, no_netrc):
    public = generate("ci-2026", tmp_path / "ci.secret")
    write(root, cache_file(trusted_keys=f'["{public}"]'))
    assert load(root, no_netrc).cache.trusted_keys == (public,)


# -- the environment over the file -----------------------------------------------------------


def test_env_remote_wins_over_the_file(root, no_netrc):
    write(root, cache_file(remote='"https://file.example.org/c"'))
    cache = load(root, no_netrc, HEFBUILD_REMOTE_CACHE="https://env.example.org/c").cache
    assert cache.remote == "https://env.example.org/c"


def test_empty_env_remote_switches_the_remote_off(root, no_netrc):
    write(root, cache_file(remote='"https://file.example.org/c"', upload="true"))
    cache = load(root, no_netrc, HEFBUILD_REMOTE_CACHE="", HEFBUILD_REMOTE_TOKEN=TOKEN).cache
    assert cache.remote is None and cache.shown == "(none)"
    assert not cache.credentials.present


@pytest.mark.parametrize(("value", "upload"), [
    ("1", True), ("0", False), ("true", True), ("false", False), ("yes", True), ("no", False),
    ("TRUE", True), (" Yes ", True), ("on", True), ("off", False), ("", False),
])
def test_env_upload_wins_over_the_file(root, no_netrc, value, upload):
    write(root, cache_file(upload="false" if upload else "true"))
    assert load(root, no_netrc, HEFBUILD_REMOTE_UPLOAD=value).cache.upload is upload


@pytest.mark.parametrize("value", ["maybe", "2", "y", "enabled"])
def test_bad_env_upload_is_one_spec_error_line(root, no_netrc, value):
    message = spec_error(root, no_netrc, "HEFBUILD_REMOTE_UPLOAD", HEFBUILD_REMOTE_UPLOAD=value)
    assert "cache.upload" in message and repr(value) in message


@pytest.mark.parametrize("value", ['"sometimes"', "2"])
def test_bad_file_upload_is_refused(root, no_netrc, value):
    write(root, cache_file(upload=value))
    spec_error(root, no_netrc, "cache.upload")


def test_env_timeout_wins_over_the_file(root, no_netrc):
    write(root, cache_file(timeout='"30s"'))
    assert load(root, no_netrc, HEFBUILD_REMOTE_TIMEOUT="5s").cache.timeout_s == 5.0
    assert load(root, no_netrc, HEFBUILD_REMOTE_TIMEOUT="7").cache.timeout_s == 7.0


def test_env_trusted_keys_are_comma_separated(root, no_netrc):
    write(root, cache_file(trusted_keys=f'["{PUB_A}"]'))
    env = {"HEFBUILD_TRUSTED_KEYS": f" {PUB_B} , {PUB_A},"}
    assert load(root, no_netrc, **env).cache.trusted_keys == (PUB_B, PUB_A)
    assert load(root, no_netrc, HEFBUILD_TRUSTED_KEYS="").cache.trusted_keys == ()


def test_env_signing_key_and_ca_bundle_win_over_the_file(root, tmp_path, no_netrc):
    for name in ("file.secret", "file.pem"):
        (root / name).write_text("x\n")
    env_key, env_ca = tmp_path / "env.secret", tmp_path / "env.pem"
    env_key.write_text("x\n")
    env_ca.write_text("x\n")
    write(root, cache_file(signing_key='"file.secret"', ca_bundle='"file.pem"'))
    cache = load(root, no_netrc, HEFBUILD_SIGNING_KEY=str(env_key),
                 HEFBUILD_REMOTE_CA_BUNDLE=str(env_ca)).cache
    assert cache.signing_key == env_key and cache.ca_bundle == env_ca


def test_env_paths_must_exist(root, tmp_path, no_netrc):
    missing = str(tmp_path / "missing.secret")
    spec_error(root, no_netrc, "signing_key", HEFBUILD_SIGNING_KEY=missing)
    spec_error(root, no_netrc, "ca_bundle", HEFBUILD_REMOTE_CA_BUNDLE=missing)


def test_env_alone_configures_a_remote(root, no_netrc):
    cache = load(root, no_netrc, HEFBUILD_REMOTE_CACHE="https://ci.example.org/c",
                 HEFBUILD_REMOTE_UPLOAD="1", HEFBUILD_REMOTE_TIMEOUT="1m").cache
    assert (cache.remote, cache.upload, cache.timeout_s) == ("https://ci.example.org/c", True,
                                                             60.0)


# -- credentials -------------------------------------------------------------------------------


REMOTE = "https://cache.example.org/hefbuild"


def test_token_from_the_env_is_a_bearer(root, no_netrc):
    creds = load(root, no_netrc, HEFBUILD_REMOTE_CACHE=REMOTE,
                 HEFBUILD_REMOTE_TOKEN=TOKEN).cache.credentials
    assert (creds.token, creds.user, creds.password) == (TOKEN, None, None)
    assert creds.present


def test_user_and_password_from_the_env_are_basic(root, no_netrc):
    creds = load(root, no_netrc, HEFBUILD_REMOTE_CACHE=REMOTE, HEFBUILD_REMOTE_USER="ci",
                 HEFBUILD_REMOTE_PASSWORD=PASSWORD).cache.credentials
    assert (creds.token, creds.user, creds.password) == (None, "ci", PASSWORD)


def test_user_without_password_gets_an_empty_password(root, no_netrc):
    creds = load(root, no_netrc, HEFBUILD_REMOTE_CACHE=REMOTE,
                 HEFBUILD_REMOTE_USER="ci").cache.credentials
    assert (creds.user, creds.password) == ("ci", "")


def test_token_wins_over_user(root, no_netrc):
    creds = load(root, no_netrc, HEFBUILD_REMOTE_CACHE=REMOTE, HEFBUILD_REMOTE_TOKEN=TOKEN,
                 HEFBUILD_REMOTE_USER="ci", HEFBUILD_REMOTE_PASSWORD=PASSWORD).cache.credentials
    assert (creds.token, creds.user) == (TOKEN, None)


def test_credentials_in_the_env_url_are_moved_out_of_it(root, no_netrc):
    url = f"https://user:{PASSWORD}@cache.example.org/hefbuild"
    cache = load(root, no_netrc, HEFBUILD_REMOTE_CACHE=url).cache
    assert cache.remote == REMOTE and cache.shown == REMOTE
    for shown in (cache.remote, cache.shown):
        assert "user" not in shown and PASSWORD not in shown and "@" not in shown
    creds = cache.credentials
    assert (creds.token, creds.user, creds.password) == (None, "user", PASSWORD)


def test_env_url_with_user_only(root, no_netrc):
    cache = load(root, no_netrc, HEFBUILD_REMOTE_CACHE="https://ci@cache.example.org/c").cache
    assert cache.remote == "https://cache.example.org/c"
    assert (cache.credentials.user, cache.credentials.password) == ("ci", None)


def test_credentials_in_the_file_url_are_refused(root, no_netrc):
    write(root, cache_file(remote=f'"https://user:{PASSWORD}@cache.example.org/hefbuild"'))
    message = spec_error(root, no_netrc, "cache.remote")
    assert PASSWORD not in message and "HEFBUILD_REMOTE_USER" in message


@pytest.mark.parametrize("env_remote", ["https://ci.example.org/c", ""])
def test_credentials_in_the_file_url_are_refused_even_when_the_env_overrides(root, no_netrc,
                                                                             env_remote):
    # The file is committed whatever CI sets: its secret must be refused on CI too.
    write(root, cache_file(remote=f'"https://user:{PASSWORD}@cache.example.org/hefbuild"'))
    try:
        load(root, no_netrc, HEFBUILD_REMOTE_CACHE=env_remote)
    except SpecError as exc:
        assert "cache.remote" in str(exc) and PASSWORD not in str(exc)
    else:
        pytest.fail("BUG settings._cache: cache.remote with user:password@ in hefbuild.toml "
                    f"is accepted when HEFBUILD_REMOTE_CACHE={env_remote!r} is set (the file "
                    "value is never looked at), while the [cache] token/password keys are "
                    "refused whatever the environment says")


def test_env_remote_with_credentials_replaces_a_clean_file_remote(root, no_netrc):
    write(root, cache_file(remote=f'"{REMOTE}"'))
    cache = load(root, no_netrc,
                 HEFBUILD_REMOTE_CACHE=f"https://ci:{PASSWORD}@other.example.org/c").cache
    assert cache.remote == "https://other.example.org/c"
    assert (cache.credentials.user, cache.credentials.password) == ("ci", PASSWORD)


def test_url_credentials_with_ipv6_and_port(root, no_netrc):
    cache = load(root, no_netrc,
                 HEFBUILD_REMOTE_CACHE=f"http://u:{PASSWORD}@[::1]:8080/x").cache
    assert cache.remote == "http://[::1]:8080/x"
    assert (cache.credentials.user, cache.credentials.password) == ("u", PASSWORD)


def test_percent_encoded_url_password_is_decoded(root, no_netrc):
    # RFC 3986: a ':' '@' or '/' in the userinfo must be percent-encoded; the credentials
    # sent to the server are the decoded text (as curl and requests do).
    cache = load(root, no_netrc,
                 HEFBUILD_REMOTE_CACHE="https://ci%40corp:p%40ss%3Aw0rd@cache.example.org/c").cache
    assert cache.remote == "https://cache.example.org/c"
    creds = cache.credentials
    assert (creds.user, creds.password) == ("ci@corp", "p@ss:w0rd"), (
        "BUG settings._remote: user/password taken from the URL are not percent-decoded "
        f"(got user={creds.user!r}), so basic auth sends the encoded text")


def test_env_credentials_win_over_the_url(root, no_netrc):
    url = "https://urluser:urlpass@cache.example.org/hefbuild"
    creds = load(root, no_netrc, HEFBUILD_REMOTE_CACHE=url,
                 HEFBUILD_REMOTE_TOKEN=TOKEN).cache.credentials
    assert (creds.token, creds.user) == (TOKEN, None)
    creds = load(root, no_netrc, HEFBUILD_REMOTE_CACHE=url, HEFBUILD_REMOTE_USER="envuser",
                 HEFBUILD_REMOTE_PASSWORD=PASSWORD).cache.credentials
    assert (creds.user, creds.password) == ("envuser", PASSWORD)


def test_netrc_for_the_cache_host_is_basic(root, tmp_path):
    env = {"NETRC": netrc_file(tmp_path, "cache.example.org", "nuser", PASSWORD)}
    creds = load(root, env, HEFBUILD_REMOTE_CACHE=REMOTE).cache.credentials
    assert (creds.token, creds.user, creds.password) == (None, "nuser", PASSWORD)


def test_netrc_in_home_is_read_without_netrc_variable(root, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(netrc_file(tmp_path, "cache.example.org", "nuser", PASSWORD), home / ".netrc")
    creds = load(root, {"HOME": str(home)}, HEFBUILD_REMOTE_CACHE=REMOTE).cache.credentials
    assert (creds.user, creds.password) == ("nuser", PASSWORD)


def test_netrc_for_another_host_gives_nothing(root, tmp_path):
    env = {"NETRC": netrc_file(tmp_path, "other.example.org", "nuser", PASSWORD)}
    creds = load(root, env, HEFBUILD_REMOTE_CACHE=REMOTE).cache.credentials
    assert creds == Credentials() and not creds.present


def test_url_and_env_credentials_win_over_netrc(root, tmp_path):
    env = {"NETRC": netrc_file(tmp_path, "cache.example.org", "nuser", PASSWORD)}
    url = "https://urluser:urlpass@cache.example.org/hefbuild"
    assert load(root, env, HEFBUILD_REMOTE_CACHE=url).cache.credentials.user == "urluser"
    creds = load(root, env, HEFBUILD_REMOTE_CACHE=REMOTE,
                 HEFBUILD_REMOTE_TOKEN=TOKEN).cache.credentials
    assert (creds.token, creds.user) == (TOKEN, None)


def test_malformed_or_missing_netrc_gives_nothing(root, tmp_path):
    bad = tmp_path / "bad.netrc"
    bad.write_text("machine\n")
    for path in (bad, tmp_path / "absent.netrc"):
        creds = load(root, {"NETRC": str(path)}, HEFBUILD_REMOTE_CACHE=REMOTE).cache.credentials
        assert not creds.present


def test_file_remotes_get_no_credentials(root, tmp_path):
    env = {"NETRC": netrc_file(tmp_path, "localhost", "nuser", PASSWORD),
           "HEFBUILD_REMOTE_TOKEN": TOKEN, "HEFBUILD_REMOTE_USER": "ci",
           "HEFBUILD_REMOTE_PASSWORD": PASSWORD}
    for url in ("file:///mnt/cache", "file://localhost/mnt/cache"):
        creds = load(root, env, HEFBUILD_REMOTE_CACHE=url).cache.credentials
        assert creds == Credentials() and not creds.present


def test_no_remote_gets_no_credentials(root, no_netrc):
    creds = load(root, no_netrc, HEFBUILD_REMOTE_TOKEN=TOKEN).cache.credentials
    assert not creds.present


@pytest.mark.parametrize("how", ["token", "env-basic", "url", "netrc"])
def test_repr_never_shows_a_secret(root, tmp_path, how):
    env = {"NETRC": str(tmp_path / "absent.netrc"), "HEFBUILD_REMOTE_CACHE": REMOTE}
    if how == "token":
        env["HEFBUILD_REMOTE_TOKEN"] = TOKEN
    elif how == "env-basic":
        env |= {"HEFBUILD_REMOTE_USER": "ci", "HEFBUILD_REMOTE_PASSWORD": PASSWORD}
    elif how == "url":
        env["HEFBUILD_REMOTE_CACHE"] = f"https://ci:{PASSWORD}@cache.example.org/hefbuild"
    else:
        env["NETRC"] = netrc_file(tmp_path, "cache.example.org", "ci", PASSWORD)
    settings = load_settings(root, env=env)
    assert settings.cache.credentials.present
    for obj in (settings, settings.cache, settings.cache.credentials):
        for text in (repr(obj), str(obj), f"{obj}"):
            assert TOKEN not in text and PASSWORD not in text, text
    assert TOKEN not in settings.cache.shown and PASSWORD not in settings.cache.shown


# -- refused -----------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["token", "password", "user", "username", "auth"])
def test_credentials_in_the_file_are_refused(root, no_netrc, key):
    write(root, cache_file(remote=f'"{REMOTE}"', **{key: f'"{TOKEN}"'}))
    message = spec_error(root, no_netrc, f"cache.{key}")
    assert "HEFBUILD_REMOTE_TOKEN" in message and ".netrc" in message
    assert TOKEN not in message


def test_unknown_cache_key_is_refused(root, no_netrc):
    write(root, cache_file(remtoe=f'"{REMOTE}"'))
    message = spec_error(root, no_netrc, "cache.remtoe")
    assert "remote" in message and "trusted_keys" in message  # lists what is expected


def test_unknown_table_is_refused(root, no_netrc):
    write(root, '[cahce]\nremote = "https://x.example.org"\n')
    spec_error(root, no_netrc, "cahce")


def test_cache_must_be_a_table(root, no_netrc):
    write(root, 'cache = "https://x.example.org"\n')
    spec_error(root, no_netrc, "cache")


def test_malformed_toml_is_one_line(root, no_netrc):
    write(root, "[cache\nremote = \n")
    spec_error(root, no_netrc, "malformed TOML")


@pytest.mark.parametrize("url", [
    "ftp://cache.example.org/c",
    "cache.example.org/c",
    "https:///no-host",
    "http://",
    "file://relative/path",
    "file:relative/path",
    "file://cache.example.org/mnt/c",
    "s3://bucket/prefix",
])
def test_bad_urls_are_refused(root, no_netrc, url):
    write(root, cache_file(remote=f'"{url}"'))
    spec_error(root, no_netrc, "cache.remote")
    spec_error(root, no_netrc, "HEFBUILD_REMOTE_CACHE", HEFBUILD_REMOTE_CACHE=url)


def test_url_error_shows_no_password(root, no_netrc):
    message = spec_error(root, no_netrc, "HEFBUILD_REMOTE_CACHE",
                         HEFBUILD_REMOTE_CACHE=f"ftp://u:{PASSWORD}@cache.example.org/c")
    assert PASSWORD not in message


def test_remote_must_be_a_string(root, no_netrc):
    write(root, cache_file(remote="5"))
    spec_error(root, no_netrc, "cache.remote")


@pytest.mark.parametrize("url", ["http://cache.example.org:http/c",
                                 "http://cache.example.org:99999/c"])
def test_bad_port_is_a_spec_error(root, no_netrc, url):
    try:
        load(root, no_netrc, HEFBUILD_REMOTE_CACHE=url)
    except SpecError as exc:
        assert str(exc).startswith("hefbuild.toml:") and "HEFBUILD_REMOTE_CACHE" in str(exc)
    except Exception as exc:  # the point is which exception escapes
        pytest.fail(f"BUG settings._remote: a bad port in {url!r} raises "
                    f"{type(exc).__name__}({exc}) from urllib's .port instead of a SpecError")
    else:
        pytest.fail(f"{url!r} was accepted")


@pytest.mark.parametrize("value", ['"nan"', '"0"', "0", "-1", '"-5s"', '"2h"', "3601",
                                   '"inf"', '"soon"', '"30x"', "true", '""', "[30]"])
def test_bad_timeouts_are_refused(root, no_netrc, value):
    write(root, cache_file(timeout=value))
    spec_error(root, no_netrc, "cache.timeout")


@pytest.mark.parametrize("value", ["nan", "0", "-1", "2h", "abc"])
def test_bad_env_timeouts_are_refused(root, no_netrc, value):
    spec_error(root, no_netrc, "HEFBUILD_REMOTE_TIMEOUT", HEFBUILD_REMOTE_TIMEOUT=value)


@pytest.mark.parametrize("keys", [
    '["ci-2026"]',
    '["ci-2026:short="]',
    f'["{PUB_A[:-1]}"]',  # no '=' padding
    f'["{PUB_A}A"]',  # one character too many
    f'["bad name{PUB_A[7:]}"]',  # a space in the name
    f'["{PUB_A[7:]}"]',  # no name
    f'["{PUB_A.replace("A", "!", 1)}"]',
    f'["{PUB_A}", 5]',
    '"ci-2026"',  # a string that is no key
    "5",
    '{ ci = "x" }',
])
def test_bad_trusted_keys_are_refused(root, no_netrc, keys):
    write(root, cache_file(trusted_keys=keys))
    spec_error(root, no_netrc, "cache.trusted_keys")


def test_bad_env_trusted_keys_are_refused(root, no_netrc):
    spec_error(root, no_netrc, "HEFBUILD_TRUSTED_KEYS",
               HEFBUILD_TRUSTED_KEYS=f"{PUB_A},not-a-key")


@pytest.mark.parametrize("key", ["signing_key", "ca_bundle"])
@pytest.mark.parametrize("value", ['"missing.pem"', '"."', "5"])
def test_missing_or_odd_paths_are_refused(root, no_netrc, key, value):
    write(root, cache_file(**{key: value}))
    spec_error(root, no_netrc, f"cache.{key}")


def test_relative_paths_are_relative_to_the_project_root(root, tmp_path, no_netrc, monkeypatch):
    (tmp_path / "ci.secret").write_text("x\n")  # in the cwd, not in the project
    monkeypatch.chdir(tmp_path)
    write(root, cache_file(signing_key='"ci.secret"'))
    spec_error(root, no_netrc, "cache.signing_key")


# -- settings are part of no key -----------------------------------------------------------------


MODEL = "tiny-llama"
STAGES = ("fetch", "export", "quantize", "compile", "verify")
RULES = ("fetch.py", "cpu_ort/export.py", "cpu_ort/quantize.py", "cpu_ort/compile.py",
         "cpu_ort/verify.py")
REPO = Path(__file__).resolve().parents[2]


def test_describe_takes_no_settings():
    params = set(inspect.signature(describe).parameters)
    assert not any("setting" in p or "remote" in p or "cache" in p for p in params), params


def test_the_remote_is_part_of_no_key(tmp_path, monkeypatch):
    for name in list(os.environ):
        if name.startswith("HEFBUILD_REMOTE") or name in ("HEFBUILD_SIGNING_KEY",
                                                          "HEFBUILD_TRUSTED_KEYS"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NETRC", str(tmp_path / "absent.netrc"))
    root = tmp_path / "proj"
    (root / "models").mkdir(parents=True)
    shutil.copy(REPO / "models" / f"{MODEL}.toml", root / "models")
    (root / "toolchain").mkdir()
    (root / "toolchain" / "host.toml").write_text(
        '[toolchain]\nkind = "host"\ninterpreter = "current"\n\n[env]\nPYTHONHASHSEED = "0"\n')
    shutil.copytree(REPO / "data", root / "data")
    for rule in RULES:
        (root / "rules" / rule).parent.mkdir(parents=True, exist_ok=True)
        (root / "rules" / rule).write_text(f"# dummy {rule}\n")
    store = tmp_path / "store"
    tasks = [f"{stage}:{MODEL}" for stage in STAGES]

    # Build once without settings: every downstream key needs its upstream's outputs.
    engine = Engine(load_project(root, store=store), executor=FakeExecutor())
    assert set(engine.actions) == set(tasks)
    assert [engine.run(task)["outcome"] for task in tasks] == ["built"] * len(tasks)

    def keys(remote: str) -> dict[str, str]:
        project = load_project(root, store=store)
        assert project.settings.cache.remote == remote
        engine = Engine(project, executor=FakeExecutor())
        found = {}
        for task, action in engine.actions.items():
            key = engine.key_of(action)
            assert remote not in canonical_json(key.description)
            found[task] = key.hex
        return found

    write(root, cache_file(remote='"https://cache-a.example.org/hefbuild"', upload="true",
                           timeout='"5s"', trusted_keys=f'["{PUB_A}"]'))
    over_https = keys("https://cache-a.example.org/hefbuild")
    write(root, cache_file(remote=f'"file://{tmp_path}/shared-cache"',
                           trusted_keys=f'["{PUB_B}"]'))
    over_file = keys(f"file://{tmp_path}/shared-cache")
    (root / "hefbuild.toml").unlink()
    without = {task: engine.key_of(engine.actions[task]).hex for task in tasks}
    assert over_https == over_file == without
    assert len(set(without.values())) == len(tasks)


# -- how fast a transfer must go, and the name entries carry --------------------------------


def test_min_rate_and_worker_have_defaults_that_name_no_machine(root, no_netrc):
    cache = load(root, no_netrc).cache
    assert cache.min_rate == 1 << 20 and cache.worker == "hefbuild"


@pytest.mark.parametrize(("value", "rate"), [('"1MiB"', 1 << 20), ('"64k"', 64 << 10),
                                             ("4096", 4096), ('"2G"', 2 << 30)])
def test_min_rate_in_the_file(root, no_netrc, value, rate):
    write(root, cache_file(min_rate=value))
    assert load(root, no_netrc).cache.min_rate == rate


@pytest.mark.parametrize("value", ['"0"', '"fast"', "-5", '"100"', "true"])
def test_a_bad_min_rate_is_one_line(root, no_netrc, value):
    write(root, cache_file(min_rate=value))
    assert "at least 1KiB" in spec_error(root, no_netrc, "cache.min_rate")


def test_env_min_rate_and_worker_win_over_the_file(root, no_netrc):
    write(root, cache_file(min_rate='"1MiB"', worker='"from-file"'))
    cache = load(root, no_netrc, HEFBUILD_REMOTE_MIN_RATE="8MiB",
                 HEFBUILD_REMOTE_WORKER="runner-9").cache
    assert (cache.min_rate, cache.worker) == (8 << 20, "runner-9")


@pytest.mark.parametrize("value", ['""', '"two words"', '"tab\\there"', "3", '"' + "w" * 129 + '"'])
def test_a_bad_worker_name_is_one_line(root, no_netrc, value):
    write(root, cache_file(worker=value))
    assert "printable ASCII" in spec_error(root, no_netrc, "cache.worker")


# -- [executor]: Ray Client addresses, refused at load -----------------------------------

@pytest.mark.parametrize("env,file,key", [
    ({"HEFBUILD_RAY_ADDRESS": "ray://head:10001"}, "", "executor.address"),
    ({}, '[executor]\nkind = "ray"\naddress = "ray://head-svc:10001"\n', "executor.address"),
    ({"HEFBUILD_EXECUTOR": "ray", "RAY_ADDRESS": "ray://head:10001"}, "", "RAY_ADDRESS"),
    ({"RAY_ADDRESS": " ray://head:10001"}, '[executor]\nkind = "ray"\naddress = "auto"\n',
     "RAY_ADDRESS"),
])
def test_a_ray_client_address_is_refused_naming_what_works(root: Path, no_netrc: dict,
                                                           env: dict, file: str,
                                                           key: str) -> None:
    if file:
        write(root, file)
    message = spec_error(root, no_netrc, key, **env)
    assert "ray://head" in message
    assert "run doit inside the cluster" in message and "ray job submit -- doit" in message


def test_gcs_addresses_and_ray_addresses_with_the_executor_off_still_load(
        root: Path, no_netrc: dict) -> None:
    on = load(root, no_netrc, HEFBUILD_RAY_ADDRESS="head:6379", RAY_ADDRESS="ray://x:1")
    assert (on.executor.kind, on.executor.address) == ("ray", "head:6379")
    assert load(root, no_netrc, RAY_ADDRESS="ray://x:1").executor.kind == "local"


# -- [gc]: the store's bounds, for `doit gc` and every cluster node ----------------------

def test_gc_bounds_from_the_file_and_the_environment(root: Path, no_netrc: dict) -> None:
    assert not load(root, no_netrc).gc.bounded
    write(root, '[gc]\nmax_size = "10G"\nmax_age = "30d"\n')
    bounds = load(root, no_netrc).gc
    assert (bounds.max_bytes, bounds.max_age_s) == (10 << 30, 30 * 86400.0)
    over = load(root, no_netrc, HEFBUILD_GC_MAX_SIZE="500M").gc
    assert (over.max_bytes, over.max_age_s) == (500 << 20, 30 * 86400.0)


@pytest.mark.parametrize("file,key", [('[gc]\nmax_size = "lots"\n', "gc.max_size"),
                                      ('[gc]\nmax_age = "soon"\n', "gc.max_age"),
                                      ('[gc]\nmax_count = 3\n', "gc.max_count"),
                                      ('gc = 3\n', "gc")])
def test_a_bad_gc_bound_is_one_line(root: Path, no_netrc: dict, file: str, key: str) -> None:
    write(root, file)
    spec_error(root, no_netrc, key)


def test_node_types_an_autoscaler_may_start_are_parsed(root, no_netrc):
    write(root, '[executor]\nkind = "ray"\naddress = "h:6379"\n'
                'node_types = [{ CPU = 4, hailo10h = 1 }, { GPU = 1, memory = "8GiB" }]\n')
    assert load(root, no_netrc).executor.node_types == (
        {"CPU": 4.0, "hailo10h": 1.0}, {"GPU": 1.0, "memory": float(8 << 30)})


@pytest.mark.parametrize(("value", "key"), [
    ('{ CPU = 4 }', "executor.node_types"),
    ('[{ CPU = 0 }]', "executor.node_types[0].CPU"),
    ('[{ "bad name" = 1 }]', "executor.node_types[0].bad name"),
])
def test_bad_node_types_are_one_line(root, no_netrc, value, key):
    write(root, f'[executor]\nkind = "ray"\naddress = "h:6379"\nnode_types = {value}\n')
    spec_error(root, no_netrc, key)
