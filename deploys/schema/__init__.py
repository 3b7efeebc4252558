"""The one typed schema for every inventory key a deploy reads.

Inventory data (host data, group data) flows: ``host.data`` -> :class:`NodeConfig` (validated, typed,
with derived values) -> deploys and audits. No deploy reads raw ``host.data`` past this package.

Keys are flat, component-prefixed pyinfra data keys (the pyinfra / Ansible-role convention). The package:

- ``base``: building blocks of every key (``_key``, ``AbsPath``, ``EnvMap``, patterns, secret names).
- one module per component, each holding its ``*Keys`` class and that component's own rules: ``cluster``,
  ``model``, ``image``, ``container`` (the container and the service it runs), ``host_tuning``,
  ``nvidia_driver``, ``container_runtime``, ``package_manager``, ``gate`` (the serving gate's qualification checks). **A new key goes into its component's module**; then
  regenerate the key table of docs/inventory-keys.md (``make readme-keys``:
  ``python -m deploys.schema --update-docs docs/inventory-keys.md``).
- ``node``: :class:`NodeConfig` (the union of the components), rules between components, derived values.
- ``problems``: :class:`Problem`, pydantic's errors as sentences, secrets never shown.
- ``control_files``: the manifest and secret files on the control node, checked once the keys parse.
- ``parse``: one host's data -> ``NodeConfig`` or its problems.
- ``cross_host``: clusters (members, head, size), rules across hosts, :func:`validate_inventory`.
- ``readme`` (and ``__main__``): the key table of docs/inventory-keys.md.

Every public name is importable from ``deploys.schema``.
"""

from deploys.schema.base import (
    DIGEST,
    HEX40,
    SECRET_NAME,
    SYSTEM_DIRS,
    AbsPath,
    ComponentKeys,
    EnvMap,
)
from deploys.schema.cluster import ClusterKeys
from deploys.schema.container import (
    DERIVED_VLLM_FLAGS,
    RESERVED_UNIT_NAMES,
    RESERVED_UNIT_PREFIXES,
    SECRET_VLLM_FLAGS,
    ContainerKeys,
    derived_vllm_flag,
)
from deploys.schema.container_runtime import ContainerRuntimeKeys, Registry, RegistryMirror
from deploys.schema.control_files import control_file_problems
from deploys.schema.endpoint import EndpointKeys
from deploys.schema.monitoring import MONITORING_GROUP, MonitoringKeys
from deploys.schema.gate import GateKeys
from deploys.schema.cross_host import (
    Cluster,
    cluster_head,
    cluster_of,
    cluster_problems,
    clusters,
    group_problems,
    machine_problems,
    validate_hosts,
    validate_inventory,
)
from deploys.schema.host_tuning import HostTuningKeys
from deploys.schema.image import ImageKeys
from deploys.schema.model import ModelKeys
from deploys.schema.node import COMPONENT_KEYS, NodeConfig
from deploys.schema.nvidia_driver import NvidiaDriverKeys
from deploys.schema.package_manager import PackageManagerKeys
from deploys.schema.parse import PYINFRA_KEYS, parse_node, schema_data
from deploys.schema.base import KeyRuleError
from deploys.schema.problems import InventoryValidationError, Problem, shown_value
from deploys.schema.secret_shapes import HIDDEN, looks_secret
from deploys.schema.readme import KEYS_PAGE, README_END, README_START, markdown_table, readme_with_table

__all__ = [
    "COMPONENT_KEYS", "DERIVED_VLLM_FLAGS", "DIGEST", "HEX40", "HIDDEN", "KEYS_PAGE", "PYINFRA_KEYS", "README_END",
    "README_START",
    "RESERVED_UNIT_NAMES", "RESERVED_UNIT_PREFIXES", "SECRET_NAME", "SECRET_VLLM_FLAGS",
    "SYSTEM_DIRS", "AbsPath", "Cluster", "ClusterKeys", "ComponentKeys", "ContainerKeys", "ContainerRuntimeKeys",
    "EndpointKeys", "MONITORING_GROUP", "MonitoringKeys", "EnvMap", "GateKeys", "HostTuningKeys", "ImageKeys", "InventoryValidationError", "KeyRuleError", "ModelKeys", "NodeConfig",
    "NvidiaDriverKeys", "PackageManagerKeys", "Problem", "Registry", "RegistryMirror", "cluster_head", "cluster_of", "cluster_problems",
    "clusters", "control_file_problems", "derived_vllm_flag", "group_problems", "looks_secret",
    "machine_problems", "markdown_table", "parse_node", "readme_with_table", "schema_data", "shown_value",
    "validate_hosts", "validate_inventory",
]
