"""The model component: the trusted manifest (manifest.py), the snapshot on each node (snapshot.py: verify, fetch
what is missing, stamp, start gate) by push (push.py: the control node's download, fetch.py; fan-out waves,
fanout.py) or from the hub (hub.py, its wheel lock hub_lock.py), and the scheduled deep verify (integrity.py)."""
