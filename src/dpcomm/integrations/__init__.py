"""dpcomm where people train (docs/frameworks/): one small module per framework, each a line or two for the
user, each building DDP with :func:`dpcomm.ddp.wrap` or sharding with :func:`dpcomm.fsdp.shard` so nothing
they do is lost (the agreed analysis, the timed trial, every DDP mode, ``mp_policy``, keyword inputs), the
example batch taken from the framework's own training data when none is given:

- :mod:`dpcomm.integrations.accelerate`: ``prepare(accelerator, model, optimizer, loader, plan=...)``;
- :mod:`dpcomm.integrations.hf`: ``Trainer``, the Hugging Face Trainer with the plan's DDP buckets;
- :mod:`dpcomm.integrations.lightning`: ``DDPStrategy``, and ``shard`` for ``configure_model``;
- :mod:`dpcomm.integrations.torchtitan`: ``planned(parallelize_fn, plan)``, torchtitan's FSDP2 step as a plan;
- :mod:`dpcomm.integrations.export`: a plan in each framework's own configuration form (DeepSpeed,
  Megatron-Core, the Trainer, Accelerate, Lightning, torchtitan), ``dpcomm plan --export``.

The frameworks are imported only by the module that needs them; none is a dependency of dpcomm.
"""
