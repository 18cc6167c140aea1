"""The remote tier (tier 2) behind the local store, and torch's own Redis remote cache.

    tier.py         the interface every backend implements, its errors, `.remote/`
    factory.py      the one place that turns the store choice into a tier
    transfer.py     one fetch path and one publish path for every backend
    packs.py        the pack format backends share (files back to back, in zstd frames)
    s3/             `store: s3` (client, index schemas, fetch, publish, invalidate)
    github/         `store: github` (the Actions cache service, the REST cache API)
    redis_cache.py  `store: redis`: torch's own remote cache, configured, not a tier

Nothing here imports the local save or restore (`store.save`, `store.restore`): "save
locally, then publish" is composed above both, in `store.tiered`.
"""
