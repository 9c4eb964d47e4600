# Runs PyTorch's torchrun (torch.distributed.run) with its arguments, for test_launcher.sh.
# Debian's torch 1.13 torchrun fails on Python 3.11 before starting any worker: its Std flag
# lookup iterates an IntFlag, which no longer yields the zero member (Std.NONE). The parse is
# replaced by a direct conversion; nothing else is changed.
import re
import sys

import torch.distributed.elastic.multiprocessing.api as api


def _std_from_str(cls, vm):
    if re.match(r"^[0-3]$", vm):
        return cls(int(vm))
    return {int(k): cls(int(v)) for k, v in (item.split(":") for item in vm.split(","))}


api.Std.from_str = classmethod(_std_from_str)

from torch.distributed.run import main  # noqa: E402

sys.exit(main())
