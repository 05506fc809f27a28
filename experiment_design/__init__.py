"""What users extend and what is shipped to the devices.

Roles (participant services), tasks, partitioners, the model registry and
split engine, the tensor transport and metric collectors live here. Nothing
in this package imports ``app_api``, rich, matplotlib or plumbum: it runs on
an edge device with only torch installed.
"""

__version__ = "0.1.0"
