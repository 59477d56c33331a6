# SPDX-License-Identifier: Apache-2.0
"""Store-traffic benchmark of the fork's sparse offload stores (issue 4)."""
