"""A profile for the lent H200 machine: just enough for validate + preflight to run there."""

cluster_name = "h200-device"
node_arch = "x86_64"
gpu_indices = [0]
tensor_parallel_size = 1
model_repo = "deepseek-ai/DeepSeek-V4-Flash-0731"
model_revision = "7872f01b1d1fe23eabc4c98b48bffcef5a386062"
model_root = "/srv/models/DeepSeek-V4-Flash-0731"
model_layout = "hf_cache"
model_size_gb = 1
image = "registry.home.arpa/vllm:deepseek-v4"
image_digest = "sha256:64b94299abdd3bcf5bb5050ca91b378f9ee4e0b0eff4748375b95352371d7cb2"
nvidia_driver_source = "preinstalled"
