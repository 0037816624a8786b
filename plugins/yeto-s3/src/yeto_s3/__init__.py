"""yeto-s3: the s3 object store (any S3-compatible service: AWS, MinIO, R2, Nebius) and the tree mirror."""

__version__ = "0.1.0"
