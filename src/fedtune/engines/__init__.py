"""Engines that run a job's phases: in-process (local), kfp.local, Kubernetes."""
