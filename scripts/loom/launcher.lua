-- loom.launcher — the command line that starts N ranks of a loom Lua program over a
-- communicator: Open MPI's ranks must come from its own launcher (mpirun), every other
-- communicator's from `loom launch`. Used by `loom bench comm` and `loom plan --calibrate`.
local launcher = {}

-- The prefix to which the program and its key=value arguments are appended.
function launcher.ranks(comm, n)
  if comm == "mpi" then
    return string.format("mpirun --allow-run-as-root --oversubscribe -np %d -x MASTER_PORT=%d %q run",
      n, 20000 + math.random(0, 19999), LOOM_EXE)
  end
  return string.format("%q launch -n %d", LOOM_EXE, n)
end

return launcher
