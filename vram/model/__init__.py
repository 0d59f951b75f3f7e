"""A model's shape: `ModelSpec` from a Hugging Face config.json, one builder per family, exact
parameter counts, and the catalog of models by slug and Hub id."""
