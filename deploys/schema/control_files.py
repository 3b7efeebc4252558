"""Checks of the files a node's keys name on the control node: the trusted manifest and the secrets (hub
token, registry auth). They run once per host after its keys parse (:func:`control_file_problems`, called
by deploys/schema/parse.py), never inside a field validator: constructing a :class:`NodeConfig` reads no file.

Relative paths (`files/manifests/...`) and "the repository" are the current directory: pyinfra, the
validate CLI and the tests all run from the repository's top.
"""

from __future__ import annotations

import os
import stat

from deploys.schema.node import NodeConfig
from deploys.schema.problems import Problem


def control_file_problems(host: str, cfg: NodeConfig) -> list[Problem]:
    """Every problem with the control-node files ``cfg`` names (empty when they are all fine)."""
    problems = []
    if cfg.registry_auth_file is not None:
        problems += _private_file_problems(host, "registry_auth_file", cfg.registry_auth_file)
    if cfg.model_manifest is not None:
        problems += _manifest_problems(host, cfg)
    if cfg.model_hub_token_file is not None:
        problems += _private_file_problems(host, "model_hub_token_file", cfg.model_hub_token_file)
    if cfg.endpoint_enabled:
        problems += _endpoint_problems(host, cfg)
    if cfg.alertmanager_webhook_url_file is not None:
        problems += _webhook_problems(host, cfg.alertmanager_webhook_url_file)
    return problems


def _webhook_problems(host: str, path: str) -> list[Problem]:
    """The Alertmanager webhook file: private, one http(s) URL (never shown: it may carry a token)."""
    from deploys.monitoring import WebhookFileError, read_webhook_url

    problems = _private_file_problems(host, "alertmanager_webhook_url_file", path)
    if not problems:
        try:
            read_webhook_url(path)
        except WebhookFileError as e:
            problems.append(Problem(host, "alertmanager_webhook_url_file", path, str(e)))
    return problems


def _endpoint_problems(host: str, cfg: NodeConfig) -> list[Problem]:
    """The endpoint's certificate, key and client keys: private files, a key that is the certificate's, a
    certificate in date, client names and keys each unique and well formed, the monitoring client among them."""
    from deploys.endpoint import EndpointFileError, read_clients, tls_pair_problem

    problems = []
    for key in ("endpoint_tls_cert", "endpoint_tls_key", "endpoint_clients_file"):
        problems += _private_file_problems(host, key, getattr(cfg, key))
    if cfg.endpoint_tls_ca is not None and not os.path.isfile(cfg.endpoint_tls_ca):
        problems.append(Problem(host, "endpoint_tls_ca", cfg.endpoint_tls_ca, "an existing file on the control node"))
    if problems:
        return problems
    if why := tls_pair_problem(cfg.endpoint_tls_cert, cfg.endpoint_tls_key):
        problems.append(Problem(host, "endpoint_tls_key", cfg.endpoint_tls_key, why))
    try:
        clients = read_clients(cfg.endpoint_clients_file)
    except EndpointFileError as e:
        return [*problems, Problem(host, "endpoint_clients_file", cfg.endpoint_clients_file, str(e))]
    if cfg.endpoint_metrics_client is not None and cfg.endpoint_metrics_client not in clients:
        problems.append(Problem(host, "endpoint_metrics_client", cfg.endpoint_metrics_client,
                                f"a client named in {cfg.endpoint_clients_file}"))
    if not [name for name in clients if name != cfg.endpoint_metrics_client]:
        problems.append(Problem(host, "endpoint_clients_file", cfg.endpoint_clients_file,
                                "at least one client besides the monitoring one"))
    return problems


def _manifest_problems(host: str, cfg: NodeConfig) -> list[Problem]:
    """The manifest reads as one (shape and every entry: relative, normalised, inside the snapshot, no
    duplicates) and is the manifest of the pinned repo and commit."""
    from deploys.model.manifest import ManifestError, read_manifest

    try:
        manifest = read_manifest(cfg.model_manifest)
    except ManifestError as e:
        return [Problem(host, "model_manifest", cfg.model_manifest, f"a valid manifest ({e})")]
    if (manifest.get("repo"), manifest.get("commit")) != (cfg.model_repo, cfg.model_revision):
        return [Problem(host, "model_manifest", cfg.model_manifest,
                        f"a manifest of {cfg.model_repo}@{cfg.model_revision}, not "
                        f"{manifest.get('repo')}@{manifest.get('commit')}")]
    return []


def _private_file_problems(host: str, key: str, path: str) -> list[Problem]:
    """A secret on the control node: it exists, only its owner can read it, and it is not in the repo."""
    if not os.path.isfile(path):
        return [Problem(host, key, path, "an existing file on the control node")]
    if os.stat(path).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        return [Problem(host, key, path, "mode 0600 (it is readable by group or others)")]
    if os.path.realpath(path).startswith(os.path.realpath(os.getcwd()) + os.sep):
        return [Problem(host, key, path, "a path outside the repository (secrets are never committed)")]
    return []
