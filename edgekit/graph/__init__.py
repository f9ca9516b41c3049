"""The one declared forward: model graphs, their rewrites (fusion) and the executor every path runs on."""
