"""The issue-6 SIP load run on a whole local stack: ``rutster sip-load`` without ``--target``.

Starts an echo brain, a gateway (spend gate on its embedded Redis, load limits lifted) and
ceil(calls / 4) ``rutster sip-worker`` processes on loopback, places the calls from pjsua2
peers, and prints the generator's report plus the stack's CPU and the gateway's /metrics.
Usage: ``python bench/sip_load.py [--calls 40] [--cps 5] [--duration 60] [--vad webrtc]``
(every ``rutster sip-load`` option works; exit 0 = PASS, 1 = FAIL, 2 = bad arguments).
"""

from __future__ import annotations

import sys

from rutster.tools.cli import main

if __name__ == "__main__":  # the peers are spawned processes: they re-import this module
    sys.exit(main(["sip-load", *sys.argv[1:]]))
