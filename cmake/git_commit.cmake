# Run at build time (cmake -P): writes OUT, a header defining CSTORCH_GIT_COMMIT as SRC's checked
# out commit ("unknown" outside a git checkout). The file is rewritten only when the commit
# changed, so a build at the same commit recompiles nothing; a build after a commit or a checkout
# recompiles the one source that includes it.
execute_process(COMMAND git -C "${SRC}" rev-parse --short=12 HEAD
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE
                ERROR_QUIET RESULT_VARIABLE result)
if(NOT result EQUAL 0 OR NOT commit)
  set(commit "unknown")
endif()
set(text "#define CSTORCH_GIT_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
