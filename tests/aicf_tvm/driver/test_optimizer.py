"""compile_optimizer_step: correct Adam steps, in place, with the donation contract checked."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from aicf_tvm import InputError, compile_optimizer_step
from aicf_tvm.driver.optimizer import adam_function, adam_state, profile_call

SHAPES = [(16, 8), (8,), (3, 5, 2)]
HYPER = {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}


def numpy_adam(p, g, m, v, t, lr, betas, eps, weight_decay):
    """One Adam step in float32, as TVM's Adam defines it (bias corrections from β^t)."""
    f = np.float32
    b1, b2 = f(betas[0]), f(betas[1])
    g = g + f(weight_decay) * p
    m = b1 * m + (f(1) - b1) * g
    v = b2 * v + (f(1) - b2) * g * g
    m_hat, v_hat = m / (f(1) - b1 ** t), v / (f(1) - b2 ** t)
    return p - f(lr) * (m_hat / (np.sqrt(v_hat) + f(eps))), m, v


@pytest.fixture(scope="module")
def step():
    return compile_optimizer_step(adam_function(SHAPES, **HYPER))


def _tensors(arrays):
    return tuple(tvm.runtime.tensor(a) for a in arrays)


def test_several_steps_match_numpy_adam_in_place(step):
    assert step.in_place and step.kernels.count("fused_adam_step") == 1
    rng = np.random.default_rng(0)
    p = [rng.standard_normal(s).astype("float32") for s in SHAPES]
    ref = [(x.copy(), np.zeros_like(x), np.zeros_like(x)) for x in p]
    params, state = _tensors(p), _tensors(adam_state(SHAPES))
    for t in range(1, 4):
        grads = [rng.standard_normal(s).astype("float32") for s in SHAPES]
        new_params, new_state = step(params, _tensors(grads), state)
        ref = [numpy_adam(*r[:1], g, *r[1:], t, **HYPER) for r, g in zip(ref, grads)]
        for k, (rp, rm, rv) in enumerate(ref):
            np.testing.assert_allclose(new_params[k].numpy(), rp, rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(new_state[3 + k].numpy(), rm, rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(new_state[3 + len(SHAPES) + k].numpy(), rv, rtol=1e-5, atol=1e-7)
            # P, M, V were updated in their own buffers: the results are the inputs.
            assert new_params[k].data_ptr() == params[k].data_ptr()
            assert new_state[3 + k].data_ptr() == state[3 + k].data_ptr()
        np.testing.assert_allclose(params[0].numpy(), ref[0][0], rtol=1e-5, atol=1e-7)
        assert int(new_state[0].numpy()) == t
        params, state = new_params, new_state


def test_rejects_aliased_inputs_at_call_time(step):
    params = _tensors([np.ones(s, "float32") for s in SHAPES])
    state = list(_tensors(adam_state(SHAPES)))
    state[3 + len(SHAPES)] = state[3]  # v of w0 is m of w0
    grads = _tensors([np.ones(s, "float32") for s in SHAPES])
    with pytest.raises(InputError, match=r"arg2\.3 and arg2\.6 share memory"):
        step(params, grads, tuple(state))
    # every parameter is its own gradient: the message names one such pair (which one
    # depends on where the buffers lie in memory)
    with pytest.raises(InputError, match=r"arg0\.(\d) and arg1\.\1 share memory"):
        step(params, params, _tensors(adam_state(SHAPES)))


def test_undonated_step_is_out_of_place_and_still_correct():
    shapes = [(4,)]
    step = compile_optimizer_step(adam_function(shapes, **HYPER), donate=False)
    assert not step.in_place
    assert "Unknown ⋢ NoAlias required by fused_adam_step" in str(step.report)
    p = np.arange(4, dtype="float32")
    g = np.ones(4, "float32")
    params = _tensors([p])
    new_params, _ = step(params, _tensors([g]), _tensors(adam_state(shapes)))
    want = numpy_adam(p, g, np.zeros(4, "float32"), np.zeros(4, "float32"), 1, **HYPER)[0]
    np.testing.assert_allclose(new_params[0].numpy(), want, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(params[0].numpy(), p)  # the input is left as it was


def test_peak_memory_of_a_10m_parameter_step_is_within_5_percent():
    """Counted at the VM's storage allocations: the step allocates (almost) nothing beyond
    P, M, V and G themselves, i.e. no copy of any of them."""
    shapes = [(2048, 2048), (2048,), (2048, 2048), (2048,), (1024, 1600), (1600,)]
    n = sum(int(np.prod(s)) for s in shapes)
    assert n >= 10_000_000
    step = compile_optimizer_step(adam_function(shapes, lr=1e-3))
    rng = np.random.default_rng(0)
    params = _tensors([rng.standard_normal(s).astype("float32") for s in shapes])
    grads = _tensors([rng.standard_normal(s).astype("float32") for s in shapes])
    state = _tensors(adam_state(shapes))
    base = 4 * 4 * n  # P, M, V, G in float32
    inputs = sum(t.numpy().nbytes for group in (params, grads, state) for t in group)
    prof = profile_call(step.vm, "main", params, grads, state)
    assert prof.kernels.count("fused_adam_step") == 1
    assert inputs + prof.storage_bytes <= 1.05 * base, (inputs, prof.storage_bytes, base)
