# Sourced by the scripts that load sluicegate's check library into a redis-server of their
# own (bench, redis-cost, redis-instructions): the library as the store joins it, its
# pieces in the order crates/sluicegate/src/store/redis/script.rs includes them. Needs
# $repo, the repository's root.

# check_library [REV]: the joined chunk on standard output, at revision REV or, without
# one, in the checkout; fails when there are no pieces to join.
check_library() {
  local rev=${1:-} dir=crates/sluicegate/src/store/redis pieces piece
  mapfile -t pieces < <(repository_file "$rev" "$dir/script.rs" |
    sed -n 's|.*include_str!("lua/\(.*\)\.lua").*|\1|p')
  [ ${#pieces[@]} -gt 0 ] || return 1
  for piece in "${pieces[@]}"; do repository_file "$rev" "$dir/lua/$piece.lua" || return 1; done
}

# repository_file REV PATH: PATH inside the repository, at REV or (REV empty) in the checkout.
repository_file() {
  if [ -n "$1" ]; then git -C "$repo" show "$1:$2"; else cat "$repo/$2"; fi
}
