"""``cord-ops serve`` and ``predict``: the HTTP app, access control, the scoring-input
contract, the rollout follower, the served-traffic monitor and batch scoring."""
