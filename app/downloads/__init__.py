"""Resumable, verified model downloads from the Hugging Face hub."""

from app.downloads.manager import DownloadManager, DownloadStatus

__all__ = ["DownloadManager", "DownloadStatus"]
