"""Put your own model files here; every ``@register_model`` in them is picked up.

Example (``experiment_design/models/user/tiny.py``)::

    from experiment_design.models import register_model

    @register_model("tiny-mlp", input_shape=(16,))
    def tiny_mlp():
        from torch import nn  # inside the factory: listing models stays torch-free

        return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
"""
