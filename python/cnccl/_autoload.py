"""Entry point for torch's device-backend autoload (``import torch``), declared only for a torch that has no
lazy backend entry points (before 2.14: setup.py, backend_entry_points).

It runs inside ``import torch``: it must be cheap and must never raise, so a broken install
warns instead of breaking torch for every program on the machine.
"""

import warnings


def autoload():
    try:
        from cnccl._registration import register

        register()
    except Exception as err:  # noqa: BLE001 - never break `import torch`
        warnings.warn(f"cnccl: backend autoload failed ({err}); `import cnccl` to see the error", stacklevel=2)
