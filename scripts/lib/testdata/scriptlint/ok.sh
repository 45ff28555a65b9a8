#!/usr/bin/env bash
# 20-line heredocs, here-strings and shifts are fine.
cat <<'EOF'
line 0
line 1
line 2
line 3
line 4
line 5
line 6
line 7
line 8
line 9
line 10
line 11
line 12
line 13
line 14
line 15
line 16
line 17
line 18
line 19
EOF
read -r x <<<"$y"
echo $((1 << 20)) $(((major << shift) | minor))
# cat <<NOT a heredoc in a comment
