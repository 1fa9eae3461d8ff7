import os
import sys

# Everything stays on loopback; workers inherit these.
os.environ.setdefault("CCL_SOCKET_IFNAME", "=lo")
os.environ.setdefault("CCL_TIMEOUT", "60")
sys.path.insert(0, os.path.dirname(__file__))
