"""``python -m bench.gpu``: the serving benchmark's device runs under the name their recorded recipes use (decisions
0001 and 0027): ``python -m bench.serving --device cuda --device-run`` and the given flags, which may name another
``--device``, ``--engine`` (the pod on the device) or ``--prepare DIR``.

    python -m bench.gpu --prepare DIR                    # the two-model repository (needs torch), to carry
    python -m bench.gpu --out DIR --artifacts DIR --device cuda
    python -m bench.gpu --out DIR --device cpu --smoke   # the rehearsal, a few seconds per point
    python -m bench.gpu --engine --out DIR --artifacts DIR --device cuda --seconds 2   # front-ends and an engine
    python -m bench.gpu --engine --before .before --frontends 12 --out DIR --artifacts DIR   # issue 65's table
"""

import sys

from bench.registry import main

if __name__ == "__main__":
    main("serving", ["--device", "cuda", "--device-run", *sys.argv[1:]])
