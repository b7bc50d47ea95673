"""Loading models/*.toml and toolchain/*.toml: typed values, or one SpecError line."""

from __future__ import annotations

import pytest
from samples import SYNTHETIC

from hefbuild.errors import SpecError

HUB = '[model]\ntarget = "cpu-ort"\n\n[source]\nhub = "org/name"\nrevision = "main"\n'


def spec_error(load, text: str | None) -> str:
    with pytest.raises(SpecError) as err:
        load(text)
    message = str(err.value)
    assert "\n" not in message
    return message


# -- valid declarations -------------------------------------------------------------------


def test_defaults_are_filled_in(model):
    m = model(SYNTHETIC)
    assert (m.name, m.file, m.target, m.toolchain) == ("m", "models/m.toml", "cpu-ort", "host")
    # The default method, weight-only int8, reads its block size; calibration is static_qdq's.
    assert m.stages["quantize"] == {"method": "weight_only_int8", "block_size": 32,
                                    "symmetric": True}
    qdq = model(SYNTHETIC + '\n[stages.quantize]\nmethod = "static_qdq"\n')
    assert qdq.stages["quantize"]["samples"] == 32
    assert qdq.stages["quantize"]["calibration"] == "data/calibration/tiny-stories.txt"
    assert m.stages["verify"]["min_token_agreement"] == 0.5
    assert m.stages["fetch"] == {}
    assert m.source.synthetic["hidden_size"] == 64
    assert m.source.synthetic["corpus"] == "data/corpus/tiny-stories.txt"
    assert "rope_theta" not in m.source.synthetic
    assert m.stage_toolchains == dict.fromkeys(m.stages, "host")


def test_given_values_override_defaults(model):
    m = model(SYNTHETIC + "\n[stages.quantize]\nmethod = \"static_qdq\"\nsamples = 8\n"
              "per_channel = true\n")
    assert m.stages["quantize"]["samples"] == 8
    assert m.stages["quantize"]["per_channel"] is True


def test_model_chat_reaches_every_stage_that_formats_prompts(model, load):
    assert model(SYNTHETIC).stages["verify"]["chat"] is False
    chat = SYNTHETIC.replace('target = "cpu-ort"', 'target = "cpu-ort"\nchat = true')
    m = model(chat)
    assert m.stages["verify"]["chat"] is True
    assert all("chat" not in m.stages[s] for s in ("fetch", "export", "quantize", "compile"))
    own = model(chat + "\n[stages.verify]\nchat = false\n")  # a stage may say otherwise
    assert own.stages["verify"]["chat"] is False
    message = spec_error(load, SYNTHETIC.replace('target = "cpu-ort"',
                                                 'target = "cpu-ort"\nchat = "yes"'))
    assert message == "models/m.toml: model.chat: true or false, got 'yes'"


def test_int_for_float_is_normalized(model):
    one = model(SYNTHETIC + "\n[stages.export]\ncosine_min = 1\n").stages["export"]
    one_point_zero = model(SYNTHETIC + "\n[stages.export]\ncosine_min = 1.0\n").stages["export"]
    assert one == one_point_zero
    assert type(one["cosine_min"]) is float


def test_synthetic_float_is_normalized(model):
    m = model(SYNTHETIC + "rope_theta = 10000\n")
    assert type(m.source.synthetic["rope_theta"]) is float


def test_hub_source_with_commit_and_files_is_pinned(model):
    sha = "a" * 64
    text = HUB.replace('"main"', f'"{"c" * 40}"') + f'\n[source.files]\n"model.bin" = "{sha}"\n'
    src = model(text).source
    assert (src.hub, src.revision, src.files) == ("org/name", "c" * 40, {"model.bin": sha})
    assert src.pinned


def test_hub_source_on_a_branch_is_not_pinned(model):
    assert not model(HUB).source.pinned


def test_toolchain_file_loads(load, proj):
    (proj / "toolchain" / "dfc.toml").write_text(
        '[toolchain]\nkind = "host"\ninterpreter = "/opt/py"\n[packages]\nnumpy = "2.1.3"\n')
    tc = load(SYNTHETIC).toolchains["dfc"]
    assert (tc.name, tc.file, tc.kind, tc.interpreter) == ("dfc", "toolchain/dfc.toml", "host",
                                                          "/opt/py")
    assert tc.packages == {"numpy": "2.1.3"} and tc.env == {}


def test_model_and_stage_toolchains(model, proj):
    (proj / "toolchain" / "x.toml").write_text('[toolchain]\nkind = "host"\n')
    text = SYNTHETIC.replace('"cpu-ort"', '"cpu-ort"\ntoolchain = "x"')
    m = model(text + '\n[stages.verify]\ntoolchain = "host"\n')
    assert m.toolchain == "x"
    assert m.stage_toolchains["export"] == "x" and m.stage_toolchains["verify"] == "host"
    assert "toolchain" not in m.stages["verify"]


def test_hailo_stages_default_to_their_toolchain(model, proj):
    for name in ("hailo-dfc-5.3.0", "hailo10h-device"):
        (proj / "toolchain" / f"{name}.toml").write_text('[toolchain]\nkind = "host"\n')
    recipes = proj / "rules" / "hailo" / "recipes"
    recipes.mkdir(parents=True)
    for name in ("optimize.alls", "compile.alls"):
        (recipes / name).write_text("# recipe\n")
    m = model(SYNTHETIC.replace("cpu-ort", "hailo10h"))
    assert m.stage_toolchains["export"] == "host"
    assert m.stage_toolchains["optimize"] == "hailo-dfc-5.3.0"
    assert m.stage_toolchains["verify"] == "hailo10h-device"
    assert m.stage_toolchains["reference"] == "host"
    assert m.stage_toolchains["fidelity"] == "host"  # a CPU emulation: no DFC, no device


# -- every bad input: one line naming the file, the key and what was expected -------------

BAD_MODELS = [
    ("[model\ntarget = 1", "models/m.toml: malformed TOML"),
    (SYNTHETIC + "\n[colour]\n", "models/m.toml: colour: unknown key (expected one of: "
                                 "model, source, stages, variants)"),
    (SYNTHETIC.replace("[model]", "[model]\ncolour = 1"), "models/m.toml: model.colour: "
                                                          "unknown key"),
    (SYNTHETIC.replace("cpu-ort", "gpu"), "models/m.toml: model.target: one of cpu-ort, "
                                          "hailo10h"),
    (SYNTHETIC + '\n[stages.quantize]\nsamples = "32"\n', "models/m.toml: stages.quantize."
                                                         "samples: expected an integer, got str"),
    (SYNTHETIC + "\n[stages.quantize]\nsamples = true\n", "models/m.toml: stages.quantize."
                                                         "samples: expected an integer, got bool"),
    (SYNTHETIC + "\n[stages.export]\ncosine_min = true\n", "stages.export.cosine_min: expected "
                                                          "a number, got bool"),
    (SYNTHETIC + "\n[stages.nope]\n", "models/m.toml: stages.nope: unknown key (expected one "
                                      "of: compile, export, fetch, quantize, verify)"),
    (SYNTHETIC + "\n[stages.quantize]\nbatch = 1\n", "models/m.toml: stages.quantize.batch: "
                                                    "unknown key"),
    (SYNTHETIC.replace("[model]", '[model]\ntoolchain = "gpu"'),
     "models/m.toml: model.toolchain: a toolchain declared in toolchain/ (host), got 'gpu'"),
    (SYNTHETIC + '\n[stages.compile]\ntoolchain = "gpu"\n',
     "models/m.toml: stages.compile.toolchain: a toolchain declared in toolchain/ (host)"),
    (SYNTHETIC + '\n[stages.quantize]\nmethod = "static_qdq"\ncalibration = "data/none.txt"\n',
     "models/m.toml: stages.quantize.calibration: file 'data/none.txt' does not exist"),
    (SYNTHETIC + "\n[stages.verify]\nmin_token_agreement = 1.5\n",
     "models/m.toml: stages.verify.min_token_agreement: expected a number <= 1.0"),
    (SYNTHETIC + "\n[stages.verify]\nmax_new_tokens = 0\n",
     "models/m.toml: stages.verify.max_new_tokens: expected an integer >= 1"),
    (SYNTHETIC + '\n[stages.quantize]\nactivation_type = "QInt4"\n',
     "models/m.toml: stages.quantize.activation_type: expected one of 'QUInt8', 'QInt8'"),
    (SYNTHETIC + '\n[stages.verify]\nprompts = ["a", 1]\n',
     "models/m.toml: stages.verify.prompts: expected a list of strings"),
    (SYNTHETIC + "\n[stages]\nverify = 3\n", "models/m.toml: stages.verify: a table, got int"),
    (SYNTHETIC.replace("seed = 1\n", ""), "models/m.toml: source.synthetic.seed: required: "
                                          "an integer"),
    (SYNTHETIC.replace('"llama"', '"gpt2"'), "models/m.toml: source.synthetic.architecture: "
                                             "expected one of"),
    (HUB.replace("org/name", "orgname"), "models/m.toml: source.hub: a hub repository id like "
                                         "'org/name'"),
    (HUB.replace('revision = "main"\n', ""), "models/m.toml: source.revision: a 40-hex commit"),
    (HUB + '\n[source.files]\n"model.bin" = "abc"\n',
     "models/m.toml: source.files.model.bin: a sha256 hex digest"),
    (HUB + "\n[source.synthetic]\narchitecture = \"llama\"\nseed = 1\n",
     "models/m.toml: source: either hub + revision or [source.synthetic], not both"),
    (SYNTHETIC.replace("[model]", "[model]\nmanual = true"),
     "models/m.toml: model.manual: one line saying why the model is left out of groups"),
    (SYNTHETIC.replace("[model]", '[model]\nmanual = ""'), "models/m.toml: model.manual: "),
    (SYNTHETIC.replace("[model]", '[model]\nmanual = """two\nlines"""'),
     "models/m.toml: model.manual: "),
]


@pytest.mark.parametrize(("text", "expected"), BAD_MODELS,
                         ids=[e.split(": ")[1] for _, e in BAD_MODELS])
def test_bad_model_is_one_spec_error_line(load, text, expected):
    assert expected in spec_error(load, text)
    assert spec_error(load, text).startswith("models/m.toml: ")


def test_missing_host_toolchain(load, proj):
    (proj / "toolchain" / "host.toml").unlink()
    assert spec_error(load, SYNTHETIC) == (
        "toolchain/host.toml: missing: the embedded default toolchain")


BAD_TOOLCHAINS = [
    ('[toolchain]\nkind = "vm"\n', "toolchain/host.toml: toolchain.kind: one of host, docker"),
    ('[toolchain]\nkind = "docker"\n', "toolchain/host.toml: toolchain.context: either context"),
    ('[toolchain]\nkind = "docker"\ncontext = "images/none"\n',
     "toolchain/host.toml: toolchain.context: a folder holding a Dockerfile"),
    ('[toolchain]\nkind = "host"\ncontext = "images/x"\n',
     "toolchain/host.toml: toolchain.context: unknown key"),
    ('[toolchain]\nkind = "host"\n[limits]\nmemory = "lots"\n',
     "toolchain/host.toml: limits.memory: expected a size"),
    ('[toolchain]\nkind = "host"\n[wheels]\n"a.whl" = "nope"\n',
     "toolchain/host.toml: wheels.a.whl: a sha256 hex digest"),
    ('[toolchain]\nkind = "host"\ncolour = 1\n', "toolchain/host.toml: toolchain.colour: "
                                                 "unknown key"),
    ('[toolchain]\nkind = "host"\n[packages]\nnumpy = 2\n',
     "toolchain/host.toml: packages.numpy: a string, got int"),
    ('[toolchain]\nkind = "host"\n[env]\nOMP_NUM_THREADS = 1\n',
     "toolchain/host.toml: env.OMP_NUM_THREADS: a string, got int"),
    ('[toolchain]\nkind = "host"\ninterpreter = ""\n',
     "toolchain/host.toml: toolchain.interpreter: 'current' or a path to a python"),
    ('[toolchain]\nkind = "host"\n[volumes]\n', "toolchain/host.toml: volumes: unknown key"),
    ('[toolchain]\nkind = "host"\nkind = "host"\n', "toolchain/host.toml: malformed TOML"),
]


@pytest.mark.parametrize(("text", "expected"), BAD_TOOLCHAINS,
                         ids=[e.split(": ")[1] for _, e in BAD_TOOLCHAINS])
def test_bad_toolchain_is_one_spec_error_line(load, proj, text, expected):
    (proj / "toolchain" / "host.toml").write_text(text)
    assert expected in spec_error(load, SYNTHETIC)


def test_spec_error_carries_its_parts(load):
    with pytest.raises(SpecError) as err:
        load(SYNTHETIC + "\n[stages.verify]\nmin_token_agreement = 1.5\n")
    assert err.value.file == "models/m.toml"
    assert err.value.key == "stages.verify.min_token_agreement"
    assert err.value.exit_code == 3


def test_absolute_file_param_is_refused(load, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("calibration from elsewhere\n")
    message = spec_error(load, SYNTHETIC + '\n[stages.quantize]\nmethod = "static_qdq"\n'
                         f'calibration = "{outside}"\n')
    assert "stages.quantize.calibration" in message


def test_fidelity_calibrates_on_optimize_rows_unless_told_otherwise(model, proj):
    for name in ("hailo-dfc-5.3.0", "hailo10h-device"):
        (proj / "toolchain" / f"{name}.toml").write_text('[toolchain]\nkind = "host"\n')
    recipes = proj / "rules" / "hailo" / "recipes"
    recipes.mkdir(parents=True)
    for name in ("optimize.alls", "compile.alls"):
        (recipes / name).write_text("# recipe\n")
    hailo = SYNTHETIC.replace('target = "cpu-ort"', 'target = "hailo10h"')
    m = model(hailo + "\n[stages.optimize]\ncalibration_size = 8\ncalibration_seed = 3\n")
    assert (m.stages["fidelity"]["calibration_size"], m.stages["fidelity"]["calibration_seed"]) \
        == (8, 3)
    own = model(hailo + "\n[stages.optimize]\ncalibration_size = 8\n"
                "\n[stages.fidelity]\ncalibration_size = 4\n")
    assert (own.stages["optimize"]["calibration_size"],
            own.stages["fidelity"]["calibration_size"]) == (8, 4)


def test_a_manual_model_says_why_and_its_variants_are_manual_too(model):
    text = SYNTHETIC.replace("[model]", '[model]\nmanual = "needs a lock"')
    spec = model(text + '\n[variants.v.stages.quantize]\nsamples = 16\n')
    assert spec.manual == "needs a lock" and spec.variants[0].manual == "needs a lock"
    assert model(SYNTHETIC).manual == ""
