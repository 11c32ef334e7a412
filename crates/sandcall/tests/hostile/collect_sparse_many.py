# Attacks: the data dir's disk, through collection. Forty sparse files of 4 MiB each take
# no room in the workspace tmpfs (they are all holes), but copying them out writes every
# hole as real bytes: 160 MiB stored for a 16 MiB workspace, kept for file_ttl_s.
# Expect: the files collected add up to at most the workspace limit, counted by their
# apparent size; the rest are listed in files_skipped as "over_workspace_limit".
import os

for i in range(40):
    with open(f"sparse{i:02}.bin", "wb") as f:
        f.truncate(4 << 20)
blocks = sum(os.stat(f"sparse{i:02}.bin").st_blocks for i in range(40))
print(f"blocks={blocks}")
