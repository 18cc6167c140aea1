"""`store: s3`: the remote tier in an S3-compatible bucket (modules listed in tier.py)."""
