"""`store: s3`: the remote tier in an S3-compatible bucket, as packs of files plus an index.

```
PREFIX/scopes/<scope-key>/head.json  the scope's remote manifest: its index segments (sha256,
                                     file count, packs each references), fingerprint, times,
                                     optional HMAC; replaced only by a conditional PUT
PREFIX/scopes/<scope-key>/last-used  empty; its LastModified is the scope's last use
PREFIX/scopes/<scope-key>/refs/<ms>-<random>
                                     immutable, head-shaped: one save's segments when it could
                                     not fold into the head at once (refs.py)
PREFIX/segments/<sha256>             immutable zstd JSON: path -> sha256, size, pack, offset;
                                     each pack's frame table
PREFIX/packs/<sha256>                immutable: many files' bytes back to back, as zstd frames
                                     (raw where they do not compress)
```

Why packs: store.remote.packs. How a save extends the index, and many writers: publish.py.
Signing covers the head, and the head names each segment by sha256, each segment each file by
sha256: a restore with the key refuses an unsigned or wrongly signed head, and a save with
the key extends only a head signed with it (publish.py).

    client.py      the S3 API as the tier uses it, through obstore: bounded timeouts and
                   retries, typed errors
    deadline.py    one time bound per restore, save or invalidate, honoured by every request
    index.py       head and segment schemas, their checks, (de)serialisation, signature
    objects.py     object keys, the client, reads of the index, this runner's memory
    parallel.py    requests on a fixed pool of threads
    fetch.py       restore: download and unpack into a fresh directory
    publish.py     save: packs, segment, one conditional head PUT (a fold), else a reference
    refs.py        references: names, capped and checked reads, the restore's view
    tier.py        S3Tier: the above as a store.remote.tier.RemoteTier
    invalidate.py  `invalidate --s3`: inventory, policies over the bucket's scopes, folds, GC
"""
