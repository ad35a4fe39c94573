"""Pipeline stages: one module per DVC stage, each with a typed config mirroring `params.yaml`."""
