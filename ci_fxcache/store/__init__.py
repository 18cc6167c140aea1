"""The local store: one directory per scope key, a signed manifest, quarantine and overlays.

Layout (see docs/contracts.md):

    <root>/<scope-key>/{manifest.json, inductor/, triton/, verify/}
    <root>/.quarantine/   scopes that failed integrity checks, kept for inspection
    <root>/.locks/        one lock file per scope (flock)
    <root>/.leases/       trusted in-place restores that have not saved yet
    <root>/.overlays/     private copy-on-write overlays of read-only restores
    <root>/.seals/        what a clean check of each scope found (store.seal)
"""
