"""`store: github`: GitHub's Actions cache as the remote tier.

cache_service.py  the Actions cache service protocol (v2): entries up and down
tier.py           the tier over it (store.remote.tier.RemoteTier)
invalidate.py     `invalidate --github`: the REST cache-management API, by policy
"""
