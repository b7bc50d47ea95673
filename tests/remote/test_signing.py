"""Ed25519 key files and entry signatures: what is signed, what verifies, what is refused."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest

from hefbuild.errors import SpecError
from hefbuild.remote.signing import DOMAIN, SigningKey, generate, main, signed_text, verify

ACTION = "a" * 64
RECORD = "b" * 64


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "ci.secret"
    generate("ci-2026", path)
    return path


@pytest.fixture
def key(key_file: Path) -> SigningKey:
    return SigningKey.load(key_file)


def new_key(tmp_path: Path, name: str, file: str | None = None) -> SigningKey:
    path = tmp_path / (file or f"{name}.secret")
    generate(name, path)
    return SigningKey.load(path)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def load_error(path: Path, text: str | bytes) -> str:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(SpecError) as err:
        SigningKey.load(path)
    message = str(err.value)
    assert "\n" not in message and path.name in message, message
    return message


# -- key files ---------------------------------------------------------------------------------


def test_generate_writes_a_private_file_and_returns_the_public_key(tmp_path):
    path = tmp_path / "ci.secret"
    public = generate("ci-2026", path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    name, _, seed = path.read_text().strip().partition(":")
    assert name == "ci-2026" and len(base64.b64decode(seed, validate=True)) == 32
    pub_name, _, raw = public.partition(":")
    assert pub_name == "ci-2026" and len(base64.b64decode(raw, validate=True)) == 32
    assert seed not in public
    assert SigningKey.load(path).public() == public


def test_generate_makes_a_new_key_each_time(tmp_path):
    assert generate("k", tmp_path / "one") != generate("k", tmp_path / "two")


def test_generate_never_overwrites(key_file):
    before = key_file.read_text()
    with pytest.raises(SpecError) as err:
        generate("other", key_file)
    assert "exists" in str(err.value) and "\n" not in str(err.value)
    assert key_file.read_text() == before


@pytest.mark.parametrize("name", ["", "ci:2026", "ci 2026", " ci", "ci\t", "ci\n2026"])
def test_generate_refuses_bad_names(tmp_path, name):
    path = tmp_path / "k.secret"
    with pytest.raises(SpecError) as err:
        generate(name, path)
    assert "NAME" in str(err.value)
    assert not path.exists()


def test_load_round_trips(key_file, key):
    name, _, seed = key_file.read_text().strip().partition(":")
    assert key.name == name == "ci-2026"
    assert key.seed == base64.b64decode(seed)
    assert SigningKey.load(key_file) == key


def test_load_accepts_surrounding_whitespace(tmp_path, key):
    path = tmp_path / "copy.secret"
    path.write_text(f"\n  {key.name}:{b64(key.seed)}  \n\n")
    assert SigningKey.load(path) == key


@pytest.mark.parametrize("text", [
    "ci:not base64!",
    "ci:" + b64(bytes(32))[:-2],  # bad padding
    "ci:" + b64(bytes(31)),
    "ci:" + b64(bytes(33)),
    "ci:" + b64(bytes(64)),
    "ci:",
    ":" + b64(bytes(32)),  # no name
    b64(bytes(32)),  # no name and no ':'
    "",
])
def test_load_refuses_malformed_files(tmp_path, text):
    load_error(tmp_path / "bad.secret", text)


def test_load_refuses_a_binary_file(tmp_path):
    load_error(tmp_path / "bad.secret", b"\xff\xfe\x00garbage")


def test_load_refuses_a_missing_file(tmp_path):
    with pytest.raises(SpecError):
        SigningKey.load(tmp_path / "absent.secret")


def test_load_refuses_non_ascii_base64_with_a_spec_error(tmp_path):
    path = tmp_path / "bad.secret"
    path.write_text("ci:é" + b64(bytes(32))[1:])
    try:
        SigningKey.load(path)
    except SpecError:
        pass
    except Exception as exc:  # the point is which exception escapes
        pytest.fail("BUG SigningKey.load: a key file with a non-ASCII character after ':' raises "
                    f"{type(exc).__name__}({exc}) instead of a SpecError (base64.b64decode raises "
                    "ValueError, not binascii.Error, for non-ASCII str)")
    else:
        pytest.fail("accepted")


def test_repr_hides_the_seed(key):
    seed_b64 = b64(key.seed)
    for text in (repr(key), str(key), f"{key}"):
        assert seed_b64 not in text and repr(key.seed) not in text
        assert key.seed.hex() not in text
        assert "ci-2026" in text


# -- signatures --------------------------------------------------------------------------------


def test_signed_text_binds_key_and_record():
    assert DOMAIN == b"hefbuild-ac-1"
    assert signed_text(ACTION, RECORD) == b"hefbuild-ac-1\0" + ACTION.encode() + b"\0" \
        + RECORD.encode()


def test_sign_then_verify_names_the_key(key):
    signature = key.sign(ACTION, RECORD)
    name, _, raw = signature.partition(":")
    assert name == "ci-2026" and len(base64.b64decode(raw, validate=True)) == 64
    assert verify(signature, ACTION, RECORD, (key.public(),)) == "ci-2026"


def test_signatures_are_deterministic(key):
    assert key.sign(ACTION, RECORD) == key.sign(ACTION, RECORD)


def test_another_key_pair_with_the_same_name_does_not_verify(tmp_path, key):
    impostor = new_key(tmp_path, "ci-2026", "impostor.secret")
    assert impostor.public() != key.public()
    assert verify(impostor.sign(ACTION, RECORD), ACTION, RECORD, (key.public(),)) is None


def test_a_different_action_key_does_not_verify(key):
    signature = key.sign(ACTION, RECORD)
    assert verify(signature, "c" * 64, RECORD, (key.public(),)) is None


def test_a_different_record_digest_does_not_verify(key):
    signature = key.sign(ACTION, RECORD)
    assert verify(signature, ACTION, "c" * 64, (key.public(),)) is None
    assert verify(signature, RECORD, ACTION, (key.public(),)) is None  # fields swapped


def test_a_tampered_signature_does_not_verify(key):
    name, _, raw = key.sign(ACTION, RECORD).partition(":")
    sig = bytearray(base64.b64decode(raw))
    for i in (0, 31, 63):
        flipped = bytearray(sig)
        flipped[i] ^= 0x01
        assert verify(f"{name}:{b64(bytes(flipped))}", ACTION, RECORD, (key.public(),)) is None
    assert verify(f"{name}:{b64(bytes(sig[:-1]))}", ACTION, RECORD, (key.public(),)) is None
    assert verify(f"{name}:{b64(bytes(sig) + b'x')}", ACTION, RECORD, (key.public(),)) is None


@pytest.mark.parametrize("signature", [
    "ci-2026:!!!not-base64!!!",
    "ci-2026:abc",  # bad padding
    "ci-2026:",
    "ci-2026",
    "",
    ":",
])
def test_garbage_signatures_do_not_verify(key, signature):
    assert verify(signature, ACTION, RECORD, (key.public(),)) is None


def test_a_non_ascii_signature_does_not_verify(key):
    # cache.py decodes each signature with errors="replace": a server's stray bytes become
    # U+FFFD, which must be a miss, not a crash.
    signature = "ci-2026:\ufffd" + key.sign(ACTION, RECORD).partition(":")[2][1:]
    try:
        result = verify(signature, ACTION, RECORD, (key.public(),))
    except Exception as exc:  # the point is which exception escapes
        pytest.fail("BUG verify: a signature with a non-ASCII character raises "
                    f"{type(exc).__name__}({exc}) instead of returning None (base64.b64decode "
                    "raises ValueError, not binascii.Error, for non-ASCII str)")
    assert result is None


def test_a_key_name_not_in_the_trusted_list_does_not_verify(tmp_path, key):
    other = new_key(tmp_path, "laptop")
    signature = other.sign(ACTION, RECORD)
    assert verify(signature, ACTION, RECORD, (key.public(),)) is None
    assert verify(signature, ACTION, RECORD, ()) is None


def test_a_signature_renamed_to_a_trusted_name_does_not_verify(tmp_path, key):
    other = new_key(tmp_path, "laptop")
    raw = other.sign(ACTION, RECORD).partition(":")[2]
    assert verify(f"ci-2026:{raw}", ACTION, RECORD, (key.public(),)) is None


def test_verify_picks_the_right_key_among_several(tmp_path, key):
    old = new_key(tmp_path, "ci-2025")
    laptop = new_key(tmp_path, "laptop")
    trusted = (old.public(), key.public(), laptop.public())
    assert verify(key.sign(ACTION, RECORD), ACTION, RECORD, trusted) == "ci-2026"
    assert verify(old.sign(ACTION, RECORD), ACTION, RECORD, trusted) == "ci-2025"
    assert verify(laptop.sign(ACTION, RECORD), ACTION, RECORD, trusted) == "laptop"


def test_verify_tries_every_trusted_key_with_the_name(tmp_path, key):
    # Rotation under one name: the old and new public key are both trusted for a while.
    rotated = new_key(tmp_path, "ci-2026", "rotated.secret")
    trusted = (rotated.public(), key.public())
    assert verify(key.sign(ACTION, RECORD), ACTION, RECORD, trusted) == "ci-2026"
    assert verify(rotated.sign(ACTION, RECORD), ACTION, RECORD, trusted) == "ci-2026"


# -- python -m hefbuild.remote.signing NAME FILE -------------------------------------------------


def test_main_writes_a_key_and_prints_the_public_key(tmp_path, capsys):
    path = tmp_path / "ci.secret"
    assert main(["ci-2026", str(path)]) == 0
    out = capsys.readouterr().out
    public = SigningKey.load(path).public()
    assert public in out and str(path) in out
    assert b64(SigningKey.load(path).seed) not in out


@pytest.mark.parametrize("argv", [[], ["ci-2026"], ["ci-2026", "a", "b"]])
def test_main_usage_is_exit_2(tmp_path, capsys, argv):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "usage" in captured.err and captured.out == ""


def test_main_bad_name_is_exit_3(tmp_path, capsys):
    path = tmp_path / "k.secret"
    assert main(["ci:2026", str(path)]) == 3
    err = capsys.readouterr().err
    assert err.startswith("ERROR: ") and err.count("\n") == 1
    assert not path.exists()


def test_main_existing_file_is_exit_3(key_file, capsys):
    before = key_file.read_text()
    assert main(["other", str(key_file)]) == 3
    assert "exists" in capsys.readouterr().err
    assert key_file.read_text() == before


def test_main_missing_directory_is_one_error_line(tmp_path, capsys):
    path = tmp_path / "no" / "such" / "dir" / "k.secret"
    try:
        code = main(["ci-2026", str(path)])
    except OSError as exc:
        pytest.fail(f"BUG signing.main/generate: a secret key path in a missing directory "
                    f"escapes as {type(exc).__name__} (a traceback) instead of an ERROR line "
                    f"and a non-zero exit")
    assert code != 0 and capsys.readouterr().err.startswith("ERROR: ")
