"""fp16 and bf16 matrix products on a CPU, computed in fp32 from the low-precision inputs
and rounded back (`Precision.kernels`, docs/stability.md "fp16 and bf16 on a CPU")."""

from __future__ import annotations

import pytest
import torch

from reference_trainer.stability.precision import Precision


@pytest.mark.parametrize("name", ["fp16", "bf16"])
def test_a_product_is_the_fp32_product_of_the_rounded_inputs_rounded_once(name: str) -> None:
    low = {"fp16": torch.float16, "bf16": torch.bfloat16}[name]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=gen, requires_grad=True)
    w = torch.randn(48, 32, generator=gen, requires_grad=True)
    precision = Precision(name, "cpu")
    with precision.kernels():
        with precision.autocast():
            y = torch.nn.functional.linear(x, w)
        y.float().square().sum().backward()
    assert y.dtype == low
    expected = (x.to(low).float() @ w.to(low).float().T).to(low)
    assert torch.equal(y, expected)
    # The backward's products too: the weight's gradient is the fp32 product of the
    # low-precision incoming gradient and input, rounded once, then widened.
    grad_y = (2 * y.float()).to(low)
    assert w.grad is not None and w.grad.dtype == torch.float32
    assert torch.equal(w.grad, (grad_y.float().T @ x.to(low).float()).to(low).float())
    # PyTorch's own CPU kernel agrees but for the last bit of a few elements.
    with precision.autocast():
        native = torch.nn.functional.linear(x, w)
    assert (native == y).float().mean() > 0.99
    assert torch.allclose(native.float(), y.float(), rtol=1e-2, atol=1e-2)


def test_a_product_past_the_fp16_range_is_inf_as_before() -> None:
    x = torch.full((2, 4), 200.0)
    w = torch.full((3, 4), 100.0)  # each sum 80000 > 65504
    precision = Precision("fp16", "cpu")
    with precision.kernels(), precision.autocast():
        y = torch.nn.functional.linear(x, w)
    assert torch.isinf(y).all()
    with precision.autocast():  # the CPU's own kernel: the same
        assert torch.isinf(torch.nn.functional.linear(x, w)).all()


def test_fp32_and_other_devices_are_left_alone() -> None:
    x, w = torch.randn(8, 4), torch.randn(3, 4)
    for precision in (Precision("fp32", "cpu"), Precision("fp16", "cuda")):
        with precision.kernels() as mode:
            assert mode is None  # no mode entered: PyTorch's kernels as they are
            assert torch.equal(torch.nn.functional.linear(x, w), x @ w.T)
    with Precision("bf16", "cpu").kernels() as mode:
        assert mode is not None
