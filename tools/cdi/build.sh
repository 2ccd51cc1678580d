#!/usr/bin/env bash
# Builds cdi-resolve (the CDI reference resolver, see main.go); see ../go-binary.sh.
exec bash "$(dirname "$0")/../go-binary.sh" cdi cdi-resolve "$(dirname "$0")"
