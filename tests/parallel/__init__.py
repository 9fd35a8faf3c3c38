"""Tests of data-parallel training (DDP, FSDP2), checkpoints and mixed precision."""
