"""Generated from proto/*.proto by build.sh (not committed)."""
