"""``python -m bench.engine.pod_of_one --port N``: a pod of one front-end and its engine, which ``CALIB_FRONTENDS``
cannot ask for (1 serves in process). Against the in-process service under the same traffic it prices the IPC
alone; a pod of two front-ends adds the cost of splitting the traffic between two processes."""

import sys

from service.engine.pod import Pod
from service.settings import Settings

if __name__ == "__main__":
    pod = Pod(Settings(port=int(sys.argv[sys.argv.index("--port") + 1])))
    pod.count = 1
    sys.exit(pod.run())
