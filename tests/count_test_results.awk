# Counts the test cases of JUnit XML files as Bazel keeps them (test.xml) and
# prints "passed failed skipped".
#  - GoogleTest writes one <testcase> per TEST; a case fails when it holds a
#    <failure> or <error>, and is skipped (GTEST_SKIP) when it says
#    result="skipped" or holds <skipped>. Disabled cases (status="notrun") are
#    not counted.
#  - For a test that wrote no XML (a crash, an sh_test) Bazel writes one with a
#    single <testcase>, holding <error> when the test exited non-zero.
# Test output inside CDATA sections (failure messages, Bazel's <system-out>
# copy of the log) can hold anything, so it is dropped before looking at tags.
function finish() {
  if (!open) return
  open = 0
  if (notrun) return
  if (failed) f++
  else if (skipped) s++
  else p++
}

FNR == 1 { finish(); in_cdata = 0 }  # each file starts afresh

{
  # The line without its CDATA text, which may span lines.
  rest = $0
  markup = ""
  while (rest != "") {
    if (in_cdata) {
      i = index(rest, "]]>")
      if (!i) break
      rest = substr(rest, i + 3)
      in_cdata = 0
    } else {
      i = index(rest, "<![CDATA[")
      if (!i) { markup = markup rest; break }
      markup = markup substr(rest, 1, i - 1)
      rest = substr(rest, i + 9)
      in_cdata = 1
    }
  }

  # One tag per piece: "testcase name=... />", "failure ...>", "/testcase>".
  n = split(markup, tags, "<")
  for (k = 2; k <= n; k++) {
    tag = tags[k]
    if (tag ~ /^testcase[[:space:]>\/]/) {
      finish()
      open = 1
      failed = 0
      skipped = (tag ~ /result="skipped"/)
      notrun = (tag ~ /status="notrun"/)
      if (tag ~ /\/>[[:space:]]*$/) finish()
    } else if (tag ~ /^(failure|error)[[:space:]>\/]/) {
      failed = 1
    } else if (tag ~ /^skipped[[:space:]>\/]/) {
      skipped = 1
    } else if (tag ~ /^\/testcase[[:space:]>]/) {
      finish()
    }
  }
}

END { finish(); printf "%d %d %d\n", p, f, s }
