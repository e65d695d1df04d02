# Counts GoogleTest cases in JUnit XML files (as Bazel keeps them): prints
# "passed failed skipped". A case fails when it holds <failure> or <error>
# (Bazel writes an <error> case for a test binary that crashed); cases that
# did not run (disabled) are not counted.
function finish() {
  if (!open) return
  open = 0
  if (notrun) return
  if (failed) f++
  else if (skipped) s++
  else p++
}
/<testcase / {
  finish()
  open = 1
  failed = 0
  skipped = ($0 ~ /result="skipped"/)
  notrun = ($0 ~ /status="notrun"/)
  if ($0 ~ /<failure|<error/) failed = 1
  if ($0 ~ /<skipped/) skipped = 1
  if ($0 ~ /\/>[[:space:]]*$/ || $0 ~ /<\/testcase>/) finish()
  next
}
/<failure|<error/ { failed = 1 }
/<skipped/ { skipped = 1 }
/<\/testcase>/ { finish() }
END { finish(); printf "%d %d %d\n", p, f, s }
