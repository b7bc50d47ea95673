"""hailo10h verify's comparison of the device's generations with reference.json
(`common.compare`), in the cpu-ort report's row shape with what the device API allows
(free-running text: no logits along the continuation), the prefill cosine of the device's
last-position logits against hf_reference.npz, and the printed summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.action import round_sig
from common.compare import NEAR_TIE, compare_generations, judge
from common.hailo_verify_retry import DeviceFailure

FAKE_WARNING = ("WARNING: the device answered as the FAKE hailo_platform test double: "
                "these figures are not a real device result")


def basis(ref: dict[str, Any], gen: dict[str, Any], encode: Any) -> tuple[str, list, list]:
    """What to compare. The genai API streams text, not ids: device_check re-tokenizes each
    piece, exact when every piece gave one id. Otherwise both sides are compared as their
    text re-tokenized by the HEF's tokenizer (same generation -> same text -> same ids)."""
    device_ids = list(gen.get("token_ids") or [])
    if gen.get("token_ids_exact", True) or encode is None or "retokenized_ids" not in gen:
        return "token_ids", list(ref["token_ids"]), device_ids
    return "retokenized_text", encode(ref["text"]), list(gen["retokenized_ids"])


def divergence_margin(ref: dict[str, Any], first: int | None, how: str,
                      near_tie: float) -> tuple[float | None, bool]:
    """The float32 top-1/top-2 margin where the device first differed (reference.json keeps
    one per generated token); only when positions are the reference's token positions."""
    margins = ref.get("margins") or []
    if how != "token_ids" or first is None or first >= len(margins):
        return None, False
    return margins[first], margins[first] < near_tie


def compare_prompt(ref: dict[str, Any], gen: dict[str, Any], min_agreement: float,
                   encode: Any = None, near_tie: float = NEAR_TIE) -> dict:
    """The cpu-ort report's row shape, with what the device API allows: free-running text
    (no logits along the continuation, so no teacher-forced figures)."""
    how, ref_ids, dev_ids = basis(ref, gen, encode)
    cmp = compare_generations(ref_ids, dev_ids)
    passed, reason = judge(cmp, min_agreement)
    margin, tie = divergence_margin(ref, cmp["first_divergence"], how, near_tie)
    return {
        "prompt": ref["prompt"],
        "sent": ref.get("formatted"),
        "prompt_ids": ref.get("prompt_ids"),
        "compared": how,
        "reference_ids": ref_ids,
        "device_ids": dev_ids,
        "reference_text": ref["text"],
        "device_text": gen.get("text", ""),
        "agreement": round_sig(cmp["agreement"]),
        "first_divergence": cmp["first_divergence"],
        "first_divergence_margin": margin,
        "near_tie": tie,
        "reference_degenerate": cmp["reference_degenerate"],
        "device_degenerate": cmp["candidate_degenerate"],
        # Not measurable on the device (text, not logits): null, as the report says.
        "teacher_forced_agreement": None,
        "logit_cosine_mean": None,
        "logit_cosine_min": None,
        "device_ids_exact": gen.get("token_ids_exact"),
        "device_stop": gen.get("stop"),
        "passed": passed,
        "reason": reason,
    }


def compare_all(reference: dict[str, Any], result: dict[str, Any], min_agreement: float,
                encode: Any = None, near_tie: float = NEAR_TIE) -> list[dict[str, Any]]:
    """Generations come back in request order (a prompt went as a one-message conversation)."""
    generations = list(result.get("generations") or [])
    if len(generations) != len(reference["prompts"]):
        raise DeviceFailure(f"the device returned {len(generations)} generations for "
                            f"{len(reference['prompts'])} prompts")
    return [compare_prompt(ref, gen, min_agreement, encode, near_tie)
            for ref, gen in zip(reference["prompts"], generations, strict=True)]


def encoder(export: Path) -> Any:
    """The HEF's tokenizer (export/tokenizer/tokenizer.json), no special tokens added."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(export / "tokenizer" / "tokenizer.json"))
    return lambda text: list(tok.encode(text, add_special_tokens=False).ids)


def prefill_figures(npz: Path, logits: Any, cosine_min: float,
                    why_not: str | None = None) -> dict[str, Any]:
    """Cosine of the device's last-position prefill logits vs HF's. When the device check
    could not drive the prefill group (e.g. it is compiled for fewer tokens than the
    reference), the check is reported as skipped with its reason, not failed."""
    import numpy as np

    if logits is None:
        return {"cosine": None, "passed": None, "skipped": True,
                "reason": f"skipped: {why_not or 'the device check returned no prefill logits'}"}
    ref = np.load(npz)["last_logits"].astype(np.float64).ravel()
    dev = np.asarray(logits, dtype=np.float64).ravel()
    if dev.shape != ref.shape:
        return {"cosine": None, "passed": False,
                "reason": f"prefill logits of shape {dev.shape}, reference {ref.shape}"}
    cosine = float(ref @ dev / (np.linalg.norm(ref) * np.linalg.norm(dev) or 1.0))
    passed = cosine >= cosine_min
    return {"cosine": round_sig(cosine), "same_argmax": int(ref.argmax()) == int(dev.argmax()),
            "passed": passed,
            "reason": "ok" if passed else f"cosine {cosine:.4g} < prefill_cosine_min {cosine_min}"}


def summarize(rows: list[dict[str, Any]], prefill: dict[str, Any] | None, fake: bool) -> None:
    for r in rows:
        mark = "PASS" if r["passed"] else "FAIL"
        print(f"[{mark}] agreement {r['agreement']:.3f} div@{r['first_divergence']} "
              f"{r['prompt']!r}")
        print(f"    ref   : {r['reference_text']!r}")
        print(f"    device: {r['device_text']!r}")
        print(f"    {r['reason']}")
    if prefill is not None:
        mark = {True: "PASS", False: "FAIL", None: "SKIP"}[prefill["passed"]]
        print(f"[{mark}] prefill cosine {prefill['cosine']}: {prefill['reason']}")
    print(f"{sum(r['passed'] for r in rows)}/{len(rows)} prompts passed")
    if fake:
        print(FAKE_WARNING)


def worst_line(rows: list[dict[str, Any]], prefill: dict[str, Any] | None) -> str | None:
    failing = [r for r in rows if not r["passed"]]
    if failing:
        bad = min(failing, key=lambda r: r["agreement"])
        return f"verify failed: worst prompt {bad['prompt']!r}: {bad['reason']}"
    if prefill is not None and prefill["passed"] is False:
        return f"verify failed: prefill check: {prefill['reason']}"
    return None
