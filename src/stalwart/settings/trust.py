"""Settings of the job's trust (part of the one schema: settings/schema.py has the rest,
settings/run_config.py composes them into ``RunConfig``): the job key that signs everything one agent
tells another (docs/security.md), and etcd's TLS client certificates and user."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from .schema import MODEL_CONFIG, setting


class TrustSettings(BaseModel):
    """What authenticates the control plane between the agents of one job (stalwart/job_key.py)."""

    model_config = MODEL_CONFIG

    key_file: Annotated[str, setting("job_key_file", "--job-key-file")] = Field(
        default="",
        description="File holding the job key that signs every record the agents exchange (mode 0600, "
        "yours; the same on every node). Default: STALWART_JOB_KEY, else ~/.config/stalwart/job.key, "
        "made on the first multi-node run (a shared home gives every node the same key).",
    )
    insecure: Annotated[bool, setting("insecure_trusted_network", "--insecure-trusted-network")] = Field(
        default=False,
        description="Several nodes without a job key: trust whoever reaches the stores (a warning on "
        "every node). Only on a network and host that no one else uses.",
    )
    etcd_cacert: Annotated[str, setting("etcd_cacert", "--etcd-cacert")] = Field(
        default="", description="etcd: CA certificate that signed the members' certificates (https)."
    )
    etcd_cert: Annotated[str, setting("etcd_cert", "--etcd-cert")] = Field(
        default="", description="etcd: this client's certificate (--client-cert-auth members)."
    )
    etcd_key: Annotated[str, setting("etcd_key", "--etcd-key")] = Field(
        default="", description="etcd: this client's private key (mode 0600)."
    )
    etcd_user: Annotated[str, setting("etcd_user", "--etcd-user")] = Field(
        default="", description="etcd: user name for etcd's authentication (with --etcd-password-file)."
    )
    etcd_password_file: Annotated[str, setting("etcd_password_file", "--etcd-password-file")] = Field(
        default="", description="etcd: file holding the user's password (mode 0600)."
    )
