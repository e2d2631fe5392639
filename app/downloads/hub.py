"""The hub as the downloader sees it: a repository's files with their checksums (through
huggingface_hub), and byte ranges of one file (plain HTTP, so a transfer can be cut at once
from another thread when the user pauses or cancels)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers

from app.net import abort_connection, open_connection, request_target

# what a checkpoint needs; other files in a repository (images, other formats) are skipped
WANTED = ("*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken", "LICENSE*", "README.md")
MAX_REDIRECTS = 5


class HubError(Exception):
    def __init__(self, message: str, retryable: bool):
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None       # LFS files
    git_sha1: str | None     # files kept in git (the hub's blob id)

    def as_dict(self) -> dict:
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "git_sha1": self.git_sha1}


@dataclass(frozen=True)
class RepoListing:
    repo_id: str
    commit: str
    files: tuple[RemoteFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def list_repo(repo_id: str, revision: str, token: str | None, endpoint: str | None) -> RepoListing:
    api = HfApi(endpoint=endpoint, token=token or None)
    try:
        info = api.model_info(repo_id, revision=revision, files_metadata=True)
    except GatedRepoError:
        raise HubError(f"{repo_id} is gated: accept its terms on huggingface.co, then add your token",
                       retryable=False) from None
    except RepositoryNotFoundError:
        raise HubError(f"{repo_id} was not found (a private repository needs your token)", retryable=False) from None
    except RevisionNotFoundError:
        raise HubError(f"{repo_id} has no revision {revision!r}", retryable=False) from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else 0
        raise HubError(f"the hub answered {status or 'an error'} for {repo_id}",
                       retryable=status == 0 or status == 429 or status >= 500) from None
    except Exception as e:  # noqa: BLE001 (unreachable hub: the HTTP library's own error types)
        raise HubError(f"cannot reach the hub ({type(e).__name__})", retryable=True) from None
    files = tuple(
        RemoteFile(s.rfilename, s.lfs.size if s.lfs else (s.size or 0), s.lfs.sha256 if s.lfs else None,
                   None if s.lfs else s.blob_id)
        for s in info.siblings or [] if any(fnmatch.fnmatch(s.rfilename.split("/")[-1], p) for p in WANTED))
    if not any(f.path.endswith(".safetensors") for f in files):
        raise HubError(f"{repo_id} has no safetensors weights", retryable=False)
    return RepoListing(repo_id, info.sha or revision, files)


def file_url(repo_id: str, path: str, commit: str, endpoint: str | None) -> str:
    return hf_hub_url(repo_id, path, revision=commit, endpoint=endpoint)


def auth_headers(token: str | None) -> dict:
    return dict(build_hf_headers(token=token or None))


class RangeReader:
    """GET `url` from byte `start` on. `status` is 206 when the server honoured the range, 200
    when it sends the whole file. abort() (any thread) ends a blocked read at once."""

    def __init__(self, url: str, start: int, headers: dict, timeout: float):
        self._conn = None
        headers = dict(headers)
        if start:
            headers["Range"] = f"bytes={start}-"
        for _ in range(MAX_REDIRECTS):
            parts = urlsplit(url)
            self._conn = open_connection(parts, timeout)
            self._conn.request("GET", request_target(self._conn, url), headers=headers)
            self.response = self._conn.getresponse()
            if self.response.status not in (301, 302, 303, 307, 308):
                break
            location = urljoin(url, self.response.getheader("Location", ""))
            self.response.read()
            self._conn.close()
            if urlsplit(location).netloc != parts.netloc:
                headers.pop("authorization", None)     # never hand the token to another host
                headers.pop("Authorization", None)
            url = location
        self.status = self.response.status

    def read(self, size: int) -> bytes:
        """What has arrived, up to `size` bytes (b"" at the end): on a slow link progress shows as bytes come,
        where read(size) would wait for all of them."""
        return self.response.read1(size)

    def abort(self) -> None:
        if self._conn:
            abort_connection(self._conn)

    def close(self) -> None:
        if self._conn:
            self._conn.close()

