"""The observer side of tracr: devices, deployment, manifests, the runner, results, the lab."""
