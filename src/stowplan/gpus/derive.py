"""Dense 16-bit tensor TFLOPs from the architecture, where no datasheet figure is at hand.

peak = tensor cores × dense FLOPs per tensor core per clock × boost clock

The per-core rates are those of NVIDIA's architecture whitepapers (one multiply-add
counts two FLOPs); each reproduces the published dense figures of the curated table
(``tests/gpus/test_gpus.py`` checks them, within 10 %, against every curated row that has both):

* Volta (GV100), Turing: 128 (fp16; these parts have no bf16);
* Ampere GA100 (A100, A30): 512; Ampere GA10x, Ada, Blackwell GB20x: 256;
* Hopper (GH100): 1024.

GeForce parts (TITAN excepted) run FP32-accumulate tensor math at half rate, so their
figure is halved.  Datacenter Blackwell (B200/B300) and parts without NVIDIA tensor cores
(AMD, Intel, Apple) get no derived figure.  The boost clock is the board's listed one; a
part whose tensor peak NVIDIA quotes at a lower clock (H100: 1830 MHz, listed 1980)
comes out a few percent high.
"""

from __future__ import annotations

__all__ = ["DENSE_FLOPS_PER_TENSOR_CORE_CLOCK", "derive_tensor_tflops"]

DENSE_FLOPS_PER_TENSOR_CORE_CLOCK: dict[str, int] = {
    "Volta": 128,
    "Turing": 128,
    "Ampere": 256,
    "Ampere GA100": 512,
    "Ada Lovelace": 256,
    "Hopper": 1024,
    "Blackwell 2.0": 256,
}
"""Dense fp16/bf16 FLOPs per tensor core per clock (FP16 accumulate), by architecture."""

_FP16_ONLY = frozenset({"Volta", "Turing"})


def derive_tensor_tflops(
    architecture: str | None,
    tensor_cores: int,
    boost_clock_mhz: float | None,
    *,
    consumer: bool,
) -> tuple[float, str] | None:
    """``(TFLOPs, how)`` of a part, or None when its architecture has no known rate.

    ``architecture`` is TechPowerUp's name (``Ampere GA100`` for the GA100 chip);
    ``consumer`` halves the rate (GeForce FP32 accumulate).
    """
    if architecture is None or boost_clock_mhz is None or tensor_cores <= 0:
        return None
    rate = DENSE_FLOPS_PER_TENSOR_CORE_CLOCK.get(architecture)
    if rate is None or boost_clock_mhz <= 0:
        return None
    factor = 0.5 if consumer else 1.0
    tflops = tensor_cores * rate * factor * boost_clock_mhz * 1e6 / 1e12
    kind = "fp16, no bf16" if architecture in _FP16_ONLY else "bf16"
    half = ", GeForce: FP32 accumulate at half rate" if consumer else ""
    how = (
        f"derived: {tensor_cores} tensor cores x {rate * factor:g} FLOPs/clock x "
        f"{boost_clock_mhz:g} MHz ({architecture} {kind}{half})"
    )
    return round(tflops, 1), how
