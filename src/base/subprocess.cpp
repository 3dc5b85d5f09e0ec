#include "base/subprocess.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace se {

Result<std::string> run_process(const std::vector<std::string>& argv) {
  if (argv.empty()) return invalid_argument("run_process: empty command");
  if (::access(argv[0].c_str(), X_OK) != 0) return not_found("{}: not executable", argv[0]);
  int out_pipe[2];
  if (::pipe(out_pipe) != 0) return internal_error("pipe failed: {}", std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) return internal_error("fork failed: {}", std::strerror(errno));
  if (pid == 0) {
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  std::string output;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(out_pipe[0], buffer, sizeof buffer)) > 0 || (n < 0 && errno == EINTR))
    if (n > 0) output.append(buffer, static_cast<size_t>(n));
  ::close(out_pipe[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return internal_error("{} failed (exit status {})", argv[0], WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return output;
}

}  // namespace se
