"""The optional ``[vision]`` extra: torchvision's ImageNet classifiers, pretrained weights read from local files,
and torchvision's transforms for the standard CIFAR augmentation.

torchvision 0.29.1 imports only beside torch 2.14.1 (a CUDA build that also runs on the CPU), so it lives in a separate
venv (``make vision``; README, "Torchvision models") and the core install never has it. The modules of this package are
the only ones that import torchvision, and only when a run asks for a ``torchvision:*`` model or ``augment``.
"""

from __future__ import annotations

from types import ModuleType

INSTALL_HINT = (
    "the optional [vision] extra: torch 2.14.1 + torchvision 0.29.1 in a separate venv "
    "(make vision; README, 'Torchvision models')"
)


def require_torchvision(what: str) -> ModuleType:
    """The torchvision module; ``ValueError`` saying that ``what`` needs the extra when it does not import."""
    try:
        import torchvision
    except Exception as exc:  # the registry's build raises more than ImportError beside another torch
        raise ValueError(
            f"{what} needs {INSTALL_HINT}; torchvision does not import here ({type(exc).__name__}: {exc})"
        ) from None
    return torchvision


def torchvision_available() -> bool:
    """Whether torchvision imports here (the [vision] venv)."""
    try:
        require_torchvision("this check")
    except ValueError:
        return False
    return True
