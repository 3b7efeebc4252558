"""The inference service, one job per module, from the bottom up: ``unit`` (the Quadlet unit and the service's
environment, rendered from inventory), ``release`` (what a release is, where it is kept, the last good one, a failed
one's record), ``door`` (draining requests, the switch marker), ``restart`` (whether to restart, workers before heads,
the door closed first), ``launch_check`` (the image's vLLM parses a new command line), ``switch`` (wait, gate, keep or
roll back), ``prune`` (releases beyond `releases_kept`), ``failed_release`` (no switch to a release that failed here)
and ``deploy`` (the `@deploy` that runs them in order)."""
