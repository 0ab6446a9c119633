"""RoPE tables: inverse frequencies and cos/sin per position, computed step for step as
transformers' `modeling_rope_utils` does (default, linear, llama3, yarn). Plain numpy: importing
this does not load the numba kernel.

The same bits on every CPU: numpy picks its float32 `power`, `cos` and `sin` loops by the CPU it
runs on (`power` is Intel SVML's on AVX-512, the C library's elsewhere; `cos`/`sin` a polynomial
whose rounding follows FMA), so a table computed with them moves by an ulp between an AVX-512
and an AVX2 host, and the int8 path turns such an ulp into other tokens. Each transcendental here
is the C library's float64 function (numpy's float64 cos/sin call it on every CPU), rounded once
to float32: the correctly rounded float32 value but in cases ~2^-29 rare."""

import math

import numpy as np

from kolibri_cli.engine.config import ModelConfig


def rope_tables(config: ModelConfig, n_pos: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [n_pos, Dh] float32, computed the way transformers' LlamaRotaryEmbedding does."""
    inv_freq, attention_factor = rope_frequencies(config)
    freqs = np.arange(n_pos, dtype=np.float32)[:, None] * inv_freq[None, :]  # [T, Dh/2]
    emb = np.concatenate([freqs, freqs], axis=1)  # [T, Dh]
    cos, sin = _cos_sin(emb)
    if attention_factor != 1.0:  # yarn scales q and k (so the scores by its square)
        cos, sin = cos * np.float32(attention_factor), sin * np.float32(attention_factor)
    return cos, sin


def _cos_sin(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 cos(x), sin(x) from the C library's float64 cos/sin (never numpy's float32 loops)"""
    x64 = x.astype(np.float64)
    return np.cos(x64).astype(np.float32), np.sin(x64).astype(np.float32)


def _pow(base: np.float32, exponents: np.ndarray) -> np.ndarray:
    """float32 base**e for each e, from the C library's float64 pow (numpy's float32 and float64
    power are SVML's on AVX-512)"""
    return np.array([math.pow(float(base), float(e)) for e in exponents]).astype(np.float32)


def rope_frequencies(config: ModelConfig) -> tuple[np.ndarray, float]:
    """inv_freq [Dh/2] float32 and the cos/sin scale, as transformers' `modeling_rope_utils`
    computes them (in float32, step for step) for rope types default, linear, llama3, yarn."""
    r, dh = config.rope_scaling, config.head_dim
    exponents = np.arange(0, dh, 2, dtype=np.float32) / np.float32(dh)  # [Dh/2]
    pos_freqs = _pow(np.float32(config.rope_theta), exponents)  # theta^(2i/Dh)
    inv_freq = (np.float32(1.0) / pos_freqs).astype(np.float32)
    if r.rope_type == "linear":
        return (inv_freq / np.float32(r.factor)).astype(np.float32), 1.0
    if r.rope_type == "llama3":
        return _llama3_frequencies(inv_freq, r), 1.0
    if r.rope_type == "yarn":
        return _yarn_frequencies(pos_freqs, r, config.rope_theta, dh)
    return inv_freq, 1.0


def _llama3_frequencies(inv_freq: np.ndarray, r) -> np.ndarray:
    """Llama 3.1: long wavelengths divided by `factor`, short ones kept, a smooth blend between."""
    f32 = np.float32
    old = r.original_max_position_embeddings
    low_wavelen, high_wavelen = old / r.low_freq_factor, old / r.high_freq_factor
    wavelen = f32(2 * np.pi) / inv_freq  # [Dh/2]
    scaled = np.where(wavelen > low_wavelen, inv_freq / f32(r.factor), inv_freq).astype(f32)
    smooth = ((f32(old) / wavelen - f32(r.low_freq_factor))
              / f32(r.high_freq_factor - r.low_freq_factor)).astype(f32)
    smoothed = (f32(1) - smooth) * scaled / f32(r.factor) + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(f32)


def _yarn_frequencies(pos_freqs: np.ndarray, r, theta: float, dh: int) -> tuple[np.ndarray, float]:
    """YaRN: interpolate low frequencies, extrapolate high ones, ramp between; scale cos/sin."""
    f32 = np.float32

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    factor = r.factor
    attention_factor = r.attention_factor
    if attention_factor is None:
        attention_factor = (mscale(factor, r.mscale) / mscale(factor, r.mscale_all_dim)
                            if r.mscale and r.mscale_all_dim else mscale(factor))

    def correction_dim(n_rot):
        return (dh * math.log(r.original_max_position_embeddings / (n_rot * 2 * math.pi))
                / (2 * math.log(theta)))

    low, high = correction_dim(r.beta_fast), correction_dim(r.beta_slow)
    if r.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dh - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dh // 2, dtype=f32) - f32(low)) / f32(high - low), 0, 1).astype(f32)
    extrapolation = (f32(1) - ramp).astype(f32)  # [Dh/2] 1 = keep the original frequency
    inv_extra = (f32(1) / pos_freqs).astype(f32)
    inv_inter = (f32(1) / (f32(factor) * pos_freqs)).astype(f32)
    inv_freq = inv_inter * (f32(1) - extrapolation) + inv_extra * extrapolation
    return inv_freq.astype(f32), float(attention_factor)

