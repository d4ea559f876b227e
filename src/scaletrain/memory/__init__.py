"""Device memory: what a job will need (``estimate``, from the model's config) and what it used (``measure``)."""
