"""The Linux AppDir and AppImage."""
