"""Keys of the container image the service runs (pulled by deploys/container_runtime.py)."""

from __future__ import annotations

from pydantic import model_validator

from deploys.schema.base import DIGEST, ComponentKeys, _key
from deploys.schema.base import KeyRuleError


class ImageKeys(ComponentKeys):
    """The container image the service runs."""

    image: str = _key(
        description="image reference without digest, e.g. `registry.home.arpa/vllm:deepseek-v4`",
        pattern=r"^[a-z0-9][a-z0-9._/:@-]*$",
    )
    image_digest: str | None = _key(None, description="digest the image is pinned to (`sha256:<64 hex>`): the registry's digest of the tag (a "
                                 "multi-arch image's index digest) or the platform manifest's")
    image_upstream: str | None = _key(
        None, description="where a mirrored image came from (documentation only; never pulled)"
    )
    allow_unpinned_image: bool = _key(
        False, description="accept an image without `image_digest` (not reproducible; off by default)"
    )

    @model_validator(mode="after")
    def _pinned(self) -> ImageKeys:
        if "@" in self.image:
            raise KeyRuleError("image", self.image, "a reference without '@digest' (put the digest in image_digest)")
        registry = self.image.split("/", 1)[0]
        if "/" not in self.image or not ("." in registry or ":" in registry or registry == "localhost"):
            raise KeyRuleError("image", self.image, "a fully qualified reference starting with its registry "
                               "(`registry.example/name:tag`, `docker.io/library/name`): a short name is resolved "
                               "through the node's search registries, and Quadlet warns about it")
        if self.image_digest is not None and not DIGEST.fullmatch(self.image_digest):
            raise KeyRuleError("image_digest", self.image_digest, "'sha256:' followed by 64 lower-case hex digits")
        if self.image_digest is None and not self.allow_unpinned_image:
            raise KeyRuleError(
                "image_digest", None, "a pinned digest (or set allow_unpinned_image: true to accept a moving tag)"
            )
        return self
