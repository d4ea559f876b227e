"""Run directories on object storage (S3, GCS, Azure; MinIO and Ceph through an endpoint)."""
