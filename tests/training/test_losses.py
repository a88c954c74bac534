"""Tests for training.losses.

Expected values are computed independently with plain ``math`` (explicit
exp / log / sums), never with torch's own loss functions.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from training.losses import (
    BrierLoss,
    ConfidencePenaltyLoss,
    CrossEntropyLoss,
    FLSD53Loss,
    FocalLoss,
    LabelSmoothingCrossEntropy,
    MarginLabelSmoothingLoss,
    MMCEWeightedLoss,
    SampleDependentFocalLoss,
    available_losses,
    build_loss,
    mmce_weighted,
)

ALL_NAMES = ["brier", "ce", "entropy_penalty", "flsd53", "focal", "label_smoothing", "mbls", "mmce"]

# A tiny batch: 2 samples, 3 classes.
# Sample 0: true class 1 is the argmax (p_y ~ 0.63, correct).
# Sample 1: true class 0 has p_y ~ 0.056 < 0.2 (wrong; argmax is class 2).
LOGITS = [[1.0, 2.0, 0.5], [0.2, -1.0, 3.0]]
TARGETS = [1, 0]


# --------------------------------------------------------------------------- helpers
def softmax_row(row):
    exps = [math.exp(v) for v in row]
    total = sum(exps)
    return [e / total for e in exps]


def as_tensors(logits=LOGITS, targets=TARGETS, dtype=torch.float64):
    return torch.tensor(logits, dtype=dtype), torch.tensor(targets, dtype=torch.int64)


def ref_ce(logits, targets):
    return sum(-math.log(softmax_row(z)[y]) for z, y in zip(logits, targets)) / len(logits)


def ref_focal_terms(logits, targets, gammas):
    out = []
    for z, y, g in zip(logits, targets, gammas):
        p = softmax_row(z)[y]
        out.append(-((1.0 - p) ** g) * math.log(p))
    return out


def value(loss, logits=LOGITS, targets=TARGETS):
    z, y = as_tensors(logits, targets)
    return loss(z, y).item()


# ------------------------------------------------------------ hand-computed values
def test_cross_entropy_value():
    # sample 0: -log(e^2 / (e^1 + e^2 + e^0.5)); sample 1: -log(e^0.2 / (e^0.2 + e^-1 + e^3))
    s0 = -(2.0 - math.log(math.exp(1.0) + math.exp(2.0) + math.exp(0.5)))
    s1 = -(0.2 - math.log(math.exp(0.2) + math.exp(-1.0) + math.exp(3.0)))
    expected = (s0 + s1) / 2
    assert value(CrossEntropyLoss()) == pytest.approx(expected, rel=1e-12)
    assert value(build_loss("ce")) == pytest.approx(ref_ce(LOGITS, TARGETS), rel=1e-12)


def test_label_smoothing_value():
    eps, k = 0.1, 3
    total = 0.0
    for z, y in zip(LOGITS, TARGETS):
        p = softmax_row(z)
        t = [(1 - eps) * (1.0 if j == y else 0.0) + eps / k for j in range(k)]
        total += -sum(t[j] * math.log(p[j]) for j in range(k))
    expected = total / 2
    assert value(LabelSmoothingCrossEntropy(smoothing=eps)) == pytest.approx(expected, rel=1e-12)


def test_label_smoothing_default_is_0_05():
    assert build_loss("label_smoothing").smoothing == 0.05


def test_focal_value():
    gamma = 2.0
    p0 = math.exp(2.0) / (math.exp(1.0) + math.exp(2.0) + math.exp(0.5))
    p1 = math.exp(0.2) / (math.exp(0.2) + math.exp(-1.0) + math.exp(3.0))
    expected = (-((1 - p0) ** 2) * math.log(p0) - ((1 - p1) ** 2) * math.log(p1)) / 2
    assert value(FocalLoss(gamma=gamma)) == pytest.approx(expected, rel=1e-12)
    # default gamma = 3
    expected3 = sum(ref_focal_terms(LOGITS, TARGETS, [3.0, 3.0])) / 2
    assert value(build_loss("focal")) == pytest.approx(expected3, rel=1e-12)


def test_flsd53_value():
    p0 = softmax_row(LOGITS[0])[1]
    p1 = softmax_row(LOGITS[1])[0]
    assert p0 >= 0.2 and p1 < 0.2  # premise of the example
    expected = (-((1 - p0) ** 3) * math.log(p0) - ((1 - p1) ** 5) * math.log(p1)) / 2
    assert value(FLSD53Loss()) == pytest.approx(expected, rel=1e-12)
    assert value(build_loss("flsd53")) == pytest.approx(expected, rel=1e-12)


def test_mbls_value_default_margin():
    # Gaps to the max logit 15: [0, 15, 12] -> hinge(d - 10) = [0, 5, 2] -> 7;
    # second sample gaps [0, 3, 1] -> 0.  Penalty mean = 3.5, alpha = 0.1.
    logits = [[15.0, 0.0, 3.0], [1.0, -2.0, 0.0]]
    targets = [0, 2]
    ce = ref_ce(logits, targets)
    expected = ce + 0.1 * (7.0 + 0.0) / 2
    assert value(MarginLabelSmoothingLoss(), logits, targets) == pytest.approx(expected, rel=1e-12)
    assert value(build_loss("mbls"), logits, targets) == pytest.approx(expected, rel=1e-12)


def test_mbls_value_custom_margin_and_class_mean():
    m, alpha, k = 0.75, 0.5, 3
    pen = []
    for z in LOGITS:
        zmax = max(z)
        pen.append(sum(max(0.0, zmax - zk - m) for zk in z))
    # sample 0: max 2 -> gaps [1, 0, 1.5] -> [0.25, 0, 0.75] = 1.0
    # sample 1: max 3 -> gaps [2.8, 4, 0] -> [2.05, 3.25, 0] = 5.3
    assert pen == pytest.approx([1.0, 5.3])
    expected_sum = ref_ce(LOGITS, TARGETS) + alpha * sum(pen) / 2
    expected_mean = ref_ce(LOGITS, TARGETS) + alpha * sum(pen) / (2 * k)
    assert value(MarginLabelSmoothingLoss(margin=m, alpha=alpha)) == pytest.approx(expected_sum, rel=1e-12)
    mean_variant = MarginLabelSmoothingLoss(margin=m, alpha=alpha, class_reduction="mean")
    assert value(mean_variant) == pytest.approx(expected_mean, rel=1e-12)


def test_brier_value():
    total = 0.0
    for z, y in zip(LOGITS, TARGETS):
        p = softmax_row(z)
        total += sum((p[j] - (1.0 if j == y else 0.0)) ** 2 for j in range(3))
    expected = total / 2
    assert value(BrierLoss()) == pytest.approx(expected, rel=1e-12)
    assert value(build_loss("brier")) == pytest.approx(expected, rel=1e-12)


def test_entropy_penalty_value():
    beta = 0.3
    total = 0.0
    for z, y in zip(LOGITS, TARGETS):
        p = softmax_row(z)
        h = -sum(pk * math.log(pk) for pk in p)
        total += -math.log(p[y]) - beta * h
    expected = total / 2
    assert value(ConfidencePenaltyLoss(beta=beta)) == pytest.approx(expected, rel=1e-12)
    default_expected = (
        ref_ce(LOGITS, TARGETS) - 0.1 * sum(-sum(pk * math.log(pk) for pk in softmax_row(z)) for z in LOGITS) / 2
    )
    assert value(build_loss("entropy_penalty")) == pytest.approx(default_expected, rel=1e-12)


def ref_mmce_w(logits, targets, width=0.4):
    """MMCE_w written out as the three double sums of Kumar et al. (2018)."""
    conf, corr = [], []
    for z, y in zip(logits, targets):
        p = softmax_row(z)
        pred = max(range(len(p)), key=lambda j: p[j])
        conf.append(max(p))
        corr.append(pred == y)
    c_idx = [i for i in range(len(conf)) if corr[i]]
    i_idx = [i for i in range(len(conf)) if not corr[i]]
    m, n = len(c_idx), len(i_idx)

    def kern(a, b):
        return math.exp(-abs(a - b) / width)

    sq = 0.0
    if m:
        sq += sum((1 - conf[i]) * (1 - conf[j]) * kern(conf[i], conf[j]) for i in c_idx for j in c_idx) / m**2
    if n:
        sq += sum(conf[i] * conf[j] * kern(conf[i], conf[j]) for i in i_idx for j in i_idx) / n**2
    if m and n:
        sq -= 2 * sum((1 - conf[i]) * conf[j] * kern(conf[i], conf[j]) for i in c_idx for j in i_idx) / (m * n)
    return math.sqrt(max(sq, 1e-10))


MMCE_LOGITS = [
    [2.0, 0.5, -1.0],  # pred 0, target 0 -> correct
    [0.3, 0.1, 0.0],  # pred 0, target 0 -> correct (low confidence)
    [1.5, 1.0, -0.5],  # pred 0, target 1 -> incorrect
    [-1.0, 0.0, 2.5],  # pred 2, target 1 -> incorrect (high confidence)
    [0.0, 3.0, 0.0],  # pred 1, target 1 -> correct
]
MMCE_TARGETS = [0, 0, 1, 1, 1]


def test_mmce_value_two_by_two():
    # 2 samples: one correct, one incorrect (m = n = 1): closed form by hand.
    r0 = max(softmax_row(LOGITS[0]))
    r1 = max(softmax_row(LOGITS[1]))
    sq = (1 - r0) ** 2 + r1**2 - 2 * (1 - r0) * r1 * math.exp(-abs(r0 - r1) / 0.4)
    expected = ref_ce(LOGITS, TARGETS) + 2.0 * math.sqrt(sq)
    assert value(MMCEWeightedLoss()) == pytest.approx(expected, rel=1e-10)
    assert value(build_loss("mmce")) == pytest.approx(expected, rel=1e-10)


def test_mmce_value_mixed_batch():
    lam = 1.5
    expected = ref_ce(MMCE_LOGITS, MMCE_TARGETS) + lam * ref_mmce_w(MMCE_LOGITS, MMCE_TARGETS)
    assert value(MMCEWeightedLoss(lam=lam), MMCE_LOGITS, MMCE_TARGETS) == pytest.approx(expected, rel=1e-10)
    z, y = as_tensors(MMCE_LOGITS, MMCE_TARGETS)
    assert mmce_weighted(z, y).item() == pytest.approx(ref_mmce_w(MMCE_LOGITS, MMCE_TARGETS), rel=1e-10)


@pytest.mark.parametrize(
    "targets",
    [
        [0, 0, 0, 2, 1],  # every prediction correct (n = 0)
        [1, 1, 2, 0, 0],  # every prediction wrong (m = 0)
    ],
)
def test_mmce_single_group_batches_are_finite(targets):
    z, y = as_tensors(MMCE_LOGITS, targets)
    z.requires_grad_(True)
    mmce = mmce_weighted(z, y)
    assert torch.isfinite(mmce)
    assert mmce.item() == pytest.approx(ref_mmce_w(MMCE_LOGITS, targets), rel=1e-10)
    loss = MMCEWeightedLoss()(z, y)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(z.grad).all()


def test_mmce_zero_estimate_keeps_finite_gradient():
    # Confidences exactly 1 and all correct: MMCE_w^2 = 0 -> clamped before sqrt.
    z = torch.tensor([[200.0, 0.0], [0.0, 200.0]], requires_grad=True)
    y = torch.tensor([0, 1])
    loss = MMCEWeightedLoss()(z, y)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(z.grad).all()
    assert loss.item() == pytest.approx(2.0 * math.sqrt(1e-10), abs=1e-6)


# ------------------------------------------------------------ reductions to CE
def test_focal_gamma_zero_equals_ce():
    z, y = as_tensors()
    assert FocalLoss(gamma=0.0)(z, y).item() == pytest.approx(CrossEntropyLoss()(z, y).item(), rel=1e-12)
    assert FocalLoss(gamma=0.0)(z, y).item() == pytest.approx(ref_ce(LOGITS, TARGETS), rel=1e-12)


def test_label_smoothing_zero_equals_ce():
    z, y = as_tensors()
    assert LabelSmoothingCrossEntropy(smoothing=0.0)(z, y).item() == pytest.approx(ref_ce(LOGITS, TARGETS), rel=1e-12)


def test_mbls_equals_ce_when_gaps_below_margin():
    # All gaps max_j z_j - z_k are < 10 (largest is 4.0).
    z, y = as_tensors()
    assert MarginLabelSmoothingLoss()(z, y).item() == pytest.approx(ref_ce(LOGITS, TARGETS), rel=1e-12)
    # Gap exactly at the margin is not penalised either.
    z2, y2 = as_tensors([[10.0, 0.0, 5.0]], [2])
    assert MarginLabelSmoothingLoss()(z2, y2).item() == pytest.approx(ref_ce([[10.0, 0.0, 5.0]], [2]), rel=1e-12)


def test_entropy_penalty_beta_zero_and_mmce_lam_zero_equal_ce():
    z, y = as_tensors()
    ce = ref_ce(LOGITS, TARGETS)
    assert ConfidencePenaltyLoss(beta=0.0)(z, y).item() == pytest.approx(ce, rel=1e-12)
    assert MMCEWeightedLoss(lam=0.0)(z, y).item() == pytest.approx(ce, rel=1e-12)


# ------------------------------------------------------------ FLSD-53 gamma choice
def test_flsd53_picks_gamma_per_sample():
    z, y = as_tensors()
    gammas = FLSD53Loss().gammas(z, y)
    assert gammas.tolist() == [3.0, 5.0]
    for i, g in enumerate([3.0, 5.0]):
        zi, yi = z[i : i + 1], y[i : i + 1]
        flsd = FLSD53Loss()(zi, yi).item()
        assert flsd == pytest.approx(ref_focal_terms([LOGITS[i]], [TARGETS[i]], [g])[0], rel=1e-12)
        assert flsd == pytest.approx(FocalLoss(gamma=g)(zi, yi).item(), rel=1e-12)
        other = 5.0 if g == 3.0 else 3.0
        assert flsd != pytest.approx(FocalLoss(gamma=other)(zi, yi).item(), rel=1e-6)


def test_flsd53_threshold_side():
    # Two classes: p_y = sigmoid(d). d = log(0.19/0.81) -> p_y = 0.19 (gamma 5),
    # d = log(0.21/0.79) -> p_y = 0.21 (gamma 3).
    logits = torch.tensor([[math.log(0.19 / 0.81), 0.0], [math.log(0.21 / 0.79), 0.0]], dtype=torch.float64)
    y = torch.tensor([0, 0])
    assert FLSD53Loss().gammas(logits, y).tolist() == [5.0, 3.0]
    expected = (-(0.81**5) * math.log(0.19) - (0.79**3) * math.log(0.21)) / 2
    assert FLSD53Loss()(logits, y).item() == pytest.approx(expected, rel=1e-10)


def test_flsd53_gradient_matches_fixed_gamma_gradient():
    # No gradient through the gamma choice: per-sample gradient equals fixed-gamma focal's.
    for i, g in enumerate([3.0, 5.0]):
        z1 = torch.tensor([LOGITS[i]], dtype=torch.float64, requires_grad=True)
        z2 = torch.tensor([LOGITS[i]], dtype=torch.float64, requires_grad=True)
        y = torch.tensor([TARGETS[i]])
        FLSD53Loss()(z1, y).backward()
        FocalLoss(gamma=g)(z2, y).backward()
        assert torch.allclose(z1.grad, z2.grad, rtol=1e-12, atol=0)


def test_sample_dependent_focal_custom_setting():
    loss = SampleDependentFocalLoss(threshold=0.7, gamma_low=1.0, gamma_high=0.0)
    z, y = as_tensors()  # p_y = 0.63 and 0.056, both < 0.7 -> gamma 1
    expected = sum(ref_focal_terms(LOGITS, TARGETS, [1.0, 1.0])) / 2
    assert loss(z, y).item() == pytest.approx(expected, rel=1e-12)


# ------------------------------------------------------------ numerics and training
EXTREME_LOGITS = [[100.0, -100.0, 0.0], [-100.0, 100.0, -100.0], [0.0, 0.0, 100.0]]
EXTREME_TARGETS = [1, 1, 0]  # wrong (confidently), right (saturated), wrong


@pytest.mark.parametrize("name", ALL_NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_logits_give_finite_loss_and_gradients(name, dtype):
    z = torch.tensor(EXTREME_LOGITS, dtype=dtype, requires_grad=True)
    y = torch.tensor(EXTREME_TARGETS)
    loss = build_loss(name)(z, y)
    assert loss.dim() == 0
    assert torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(z.grad).all()


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 3.0])
def test_focal_saturated_true_class_has_finite_gradient(gamma):
    z = torch.tensor([[100.0, -100.0, -100.0]], requires_grad=True)
    y = torch.tensor([0])
    loss = FocalLoss(gamma=gamma)(z, y)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(z.grad).all()


@pytest.mark.parametrize("name", ALL_NAMES)
def test_one_sgd_step_decreases_loss(name):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=gen)
    true_w = torch.randn(4, 3, generator=gen)
    y = (x @ true_w).argmax(dim=1)
    model = torch.nn.Linear(4, 3)
    with torch.no_grad():
        model.weight.copy_(0.5 * torch.randn(3, 4, generator=gen))
        model.bias.zero_()
    loss_fn = build_loss(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    before = loss_fn(model(x), y)
    opt.zero_grad()
    before.backward()
    for p in model.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all()
        assert p.grad.abs().sum() > 0
    opt.step()
    with torch.no_grad():
        after = loss_fn(model(x), y)
    assert after.item() < before.item()


def test_mbls_penalty_shrinks_large_gaps_under_sgd():
    z = torch.tensor([[20.0, 0.0, 5.0]], requires_grad=True)
    y = torch.tensor([0])
    loss_fn = MarginLabelSmoothingLoss()
    loss_fn(z, y).backward()
    # Hinge gradient alpha * (+1 on the max logit count of active classes, -1 on active classes).
    # Active classes: 1 (gap 20) and 2 (gap 15). CE gradient on class 1 is ~0.
    assert z.grad[0, 1].item() < 0  # pushing the far-away logit up
    assert z.grad[0, 0].item() > 0  # pushing the max logit down


# ------------------------------------------------------------ properties
small_logits = st.lists(st.lists(st.floats(-20, 20, allow_nan=False), min_size=3, max_size=3), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None)
@given(logits=small_logits, data=st.data())
def test_property_bounds(logits, data):
    targets = data.draw(st.lists(st.integers(0, 2), min_size=len(logits), max_size=len(logits)))
    z, y = as_tensors(logits, targets)
    ce = CrossEntropyLoss()(z, y).item()
    assert FocalLoss(gamma=2.0)(z, y).item() <= ce + 1e-12
    assert FLSD53Loss()(z, y).item() <= ce + 1e-12
    brier = BrierLoss()(z, y).item()
    assert -1e-12 <= brier <= 2.0 + 1e-12
    assert MarginLabelSmoothingLoss()(z, y).item() >= ce - 1e-12
    assert MMCEWeightedLoss()(z, y).item() >= ce
    assert ConfidencePenaltyLoss(beta=0.1)(z, y).item() >= ce - 0.1 * math.log(3) - 1e-12
    assert math.isfinite(mmce_weighted(z, y).item())


# ------------------------------------------------------------ input validation
BAD_INPUTS = [
    (torch.zeros(3), torch.zeros(3, dtype=torch.long), "2-D"),
    (torch.zeros(2, 3, 1), torch.zeros(2, dtype=torch.long), "2-D"),
    (torch.zeros(2, 1), torch.zeros(2, dtype=torch.long), "K >= 2"),
    (torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), "empty batch"),
    (torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, dtype=torch.long), "floating-point"),
    (torch.zeros(2, 3), torch.zeros(2, 1, dtype=torch.long), "1-D"),
    (torch.zeros(2, 3), torch.zeros(2), "integer"),
    (torch.zeros(2, 3), torch.zeros(2, dtype=torch.bool), "integer"),
    (torch.zeros(2, 3), torch.zeros(3, dtype=torch.long), "batch size"),
    (torch.zeros(2, 3), torch.tensor([0, 3]), "[0, 3)"),
    (torch.zeros(2, 3), torch.tensor([-1, 0]), "[0, 3)"),
]


@pytest.mark.parametrize("name", ALL_NAMES)
@pytest.mark.parametrize("logits,targets,fragment", BAD_INPUTS)
def test_invalid_inputs_raise(name, logits, targets, fragment):
    with pytest.raises(ValueError) as err:
        build_loss(name)(logits, targets)
    assert fragment in str(err.value)
    assert name in str(err.value)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_other_integer_target_dtypes_accepted(name):
    z, _ = as_tensors()
    for dtype in (torch.int32, torch.int64, torch.uint8):
        loss = build_loss(name)(z, torch.tensor(TARGETS, dtype=dtype))
        assert torch.isfinite(loss)


# ------------------------------------------------------------ registry
def test_available_losses():
    assert available_losses() == sorted(ALL_NAMES)


def test_registry_defaults():
    assert build_loss("focal").gamma == 3.0
    mbls = build_loss("mbls")
    assert (mbls.margin, mbls.alpha) == (10.0, 0.1)
    assert build_loss("mmce").lam == 2.0
    assert build_loss("entropy_penalty").beta == 0.1
    flsd = build_loss("flsd53")
    assert (flsd.threshold, flsd.gamma_low, flsd.gamma_high) == (0.2, 5.0, 3.0)


def test_registry_passes_parameters():
    assert build_loss("focal", gamma=1.5).gamma == 1.5
    assert build_loss("label_smoothing", smoothing=0.2).smoothing == 0.2
    assert build_loss("mbls", margin=5.0, alpha=0.3).margin == 5.0
    assert build_loss("mmce", lam=4.0).lam == 4.0
    assert build_loss("entropy_penalty", beta=0.5).beta == 0.5


def test_unknown_loss_name():
    with pytest.raises(ValueError) as err:
        build_loss("hinge")
    msg = str(err.value)
    assert "'hinge'" in msg
    for known in ALL_NAMES:
        assert known in msg


@pytest.mark.parametrize(
    "name,params,bad",
    [
        ("focal", {"gama": 2.0}, "gama"),
        ("ce", {"smoothing": 0.1}, "smoothing"),
        ("flsd53", {"gamma": 2.0}, "gamma"),
        ("mbls", {"lam": 1.0}, "lam"),
    ],
)
def test_unknown_parameter(name, params, bad):
    with pytest.raises(ValueError) as err:
        build_loss(name, **params)
    msg = str(err.value)
    assert f"'{bad}'" in msg and "unknown parameter" in msg and name in msg


@pytest.mark.parametrize(
    "name,params,bad",
    [
        ("focal", {"gamma": -1.0}, "gamma"),
        ("focal", {"gamma": float("nan")}, "gamma"),
        ("focal", {"gamma": "2"}, "gamma"),
        ("focal", {"gamma": True}, "gamma"),
        ("label_smoothing", {"smoothing": 1.0}, "smoothing"),
        ("label_smoothing", {"smoothing": -0.01}, "smoothing"),
        ("mbls", {"margin": -1.0}, "margin"),
        ("mbls", {"alpha": -0.1}, "alpha"),
        ("mbls", {"class_reduction": "max"}, "class_reduction"),
        ("mmce", {"lam": -2.0}, "lam"),
        ("mmce", {"kernel_width": 0.0}, "kernel_width"),
        ("entropy_penalty", {"beta": -0.1}, "beta"),
        ("entropy_penalty", {"beta": float("inf")}, "beta"),
    ],
)
def test_invalid_parameter_values(name, params, bad):
    with pytest.raises(ValueError) as err:
        build_loss(name, **params)
    assert f"'{bad}'" in str(err.value)


def test_integer_parameters_accepted():
    assert build_loss("focal", gamma=2).gamma == 2.0
    assert build_loss("mbls", margin=0).margin == 0.0
